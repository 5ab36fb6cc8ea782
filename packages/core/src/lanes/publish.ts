/**
 * The publishing half of the transactional backlog (#20 item 2; ADR 0011):
 * `countTransactional(port, backlog)` is the same QueuePort, except that a job
 * published on a `notif.{channel}.transactional` queue is put into the
 * channel's backlog first — before the transport has it, so no consumer can
 * settle it before it is counted. Give it to everything that publishes
 * transactional jobs: the module's producers, the outbox relay, fan-out.
 *
 * When the backlog cannot be written the job is published all the same (a
 * notification is never held back by its own bookkeeping), and the failure
 * is logged: the channel's marketing consumers then see a smaller backlog
 * than there is, until the store is back. A job whose publish fails stays
 * counted until it goes stale or a copy settles it: erring towards "there is
 * transactional work" only ever makes marketing wait.
 */
import { type Envelope, isJobId } from "../envelope.ts";
import { describeError } from "../errors.ts";
import { consoleLogger, type Logger } from "../ports/logger.ts";
import type { PublishOptions, PublishReceipt, QueuePort } from "../queue-port.ts";
import type { LaneBacklog } from "./backlog.ts";
import { parseLaneQueue } from "./names.ts";

export interface CountTransactionalOptions {
  /** @default console */
  readonly logger?: Logger;
  /** @default Date.now */
  readonly now?: () => number;
}

export function countTransactional(
  port: QueuePort,
  backlog: LaneBacklog,
  options: CountTransactionalOptions = {},
): QueuePort {
  const logger = options.logger ?? consoleLogger;
  const now = options.now ?? Date.now;

  const count = async (queue: string, payload: Envelope, dueAt: number): Promise<void> => {
    const lane = parseLaneQueue(queue);
    // An invalid envelope is the port's to refuse (InvalidEnvelopeError): it never becomes backlog.
    if (lane?.lane !== "transactional" || !isJobId(payload?.job_id)) return;
    try {
      await backlog.add(lane.channel, [{ jobId: payload.job_id, dueAt }]);
    } catch (error) {
      logger.warn(
        `job ${payload?.job_id} published on ${queue} without being counted in its transactional backlog: ${describeError(error)}`,
      );
    }
  };

  return {
    async publish(queue: string, payload: Envelope, opts?: PublishOptions): Promise<PublishReceipt> {
      const delayMs = opts?.delayMs;
      await count(
        queue,
        payload,
        now() + (Number.isFinite(delayMs) && (delayMs as number) > 0 ? (delayMs as number) : 0),
      );
      return port.publish(queue, payload, opts);
    },
    async schedule(queue: string, payload: Envelope, runAt: Date): Promise<PublishReceipt> {
      const at = runAt instanceof Date ? runAt.getTime() : Number.NaN;
      await count(queue, payload, Number.isFinite(at) ? Math.max(at, now()) : now());
      return port.schedule(queue, payload, runAt);
    },
  };
}
