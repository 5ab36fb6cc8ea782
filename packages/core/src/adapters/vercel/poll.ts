/**
 * Poll delivery, for long-running processes: `startWorker(bound)` runs poll
 * loops (`PollWorker`: live lanes, and replay lanes of their own, seen as
 * one `CombinedWorker`) until stopped, backing off on failures and failing
 * after too many auth failures in a row; `receiveAvailable(bound)` drains
 * once (e.g. from a cron function). Each receive takes one message and runs
 * it through the lease lifecycle (lease.ts).
 */
import type { Clock } from "../../clock.ts";
import { describeError } from "../../errors.ts";
import type { Logger } from "../../ports/logger.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { timerDelay } from "../../timers.ts";
import { nonNegative, positiveInteger } from "../../validate.ts";
import { bindLane, flushAlerts, type Lane } from "./lane.ts";
import type { ModeContext } from "./lease.ts";
import { authFailure } from "./service.ts";
import type { VercelIncident, VercelWorker, VercelWorkerHealth, VercelWorkerOptions } from "./types.ts";

/** Thrown from a poll delivery that must not be acknowledged: the service redelivers it. */
class NotAcknowledged extends Error {
  override readonly name = "NotAcknowledged";
}

/**
 * Starts a poll loop delivering `consumer`'s queue (consumer group = its
 * mapped name), and one for its replay topic, until `stop()`.
 */
export function startWorker(
  ctx: ModeContext,
  consumer: BoundConsumer,
  options: VercelWorkerOptions = {},
): PollWorker | CombinedWorker {
  const lane = bindLane(ctx.config, ctx.api, consumer, "poll", options.maxDeliveries);
  const settings = {
    idleDelayMs: nonNegative(options.idleDelayMs ?? 1_000, "idleDelayMs"),
    errorDelayMs: nonNegative(options.errorDelayMs ?? 5_000, "errorDelayMs"),
    authAlertAfter: positiveInteger(options.authAlertAfter ?? 3, "authAlertAfter"),
    maxAuthFailures: positiveInteger(options.maxAuthFailures ?? 20, "maxAuthFailures"),
  };
  const replayLanes = nonNegative(options.replayConcurrency ?? 1, "replayConcurrency");
  const poll = (from: Lane, concurrency: number, label: string) =>
    new PollWorker(
      () => receiveOne(ctx, from),
      { ...settings, concurrency },
      ctx.clock,
      (kind, message, alert) =>
        ctx.incidents.report({ kind, queue: consumer.queue, consumer: consumer.name, message, alert }),
      ctx.logger,
      label,
    );
  const live = poll(
    lane,
    positiveInteger(options.concurrency ?? 4, "concurrency"),
    `${consumer.name} on ${consumer.queue}`,
  );
  // Replays on lanes of their own: they never take a live lane (SPEC §5).
  const replays =
    replayLanes > 0
      ? poll(
          { ...lane, topic: lane.replayTopic },
          positiveInteger(replayLanes, "replayConcurrency"),
          `${consumer.name} replays on ${consumer.queue}`,
        )
      : undefined;
  return replays ? new CombinedWorker([live, replays]) : live;
}

/** Receives until the queue reports empty, `concurrency` at a time, then the replays. Returns the deliveries made. */
export async function receiveAvailable(
  ctx: ModeContext,
  consumer: BoundConsumer,
  options: { readonly concurrency?: number; readonly maxDeliveries?: number } = {},
): Promise<number> {
  const lane = bindLane(ctx.config, ctx.api, consumer, "poll", options.maxDeliveries);
  const concurrency = positiveInteger(options.concurrency ?? 1, "concurrency");
  let delivered = 0;
  let failure: { error: unknown } | undefined;
  const run = async (from: Lane) => {
    // Every lane stops at the first failure, so none keeps receiving after this call returned.
    while (!failure) {
      let outcome: "delivered" | "empty";
      try {
        outcome = await receiveOne(ctx, from);
      } catch (error) {
        // A delivery that is left unacknowledged still counts; the lease brings it back.
        if (!(error instanceof NotAcknowledged)) {
          failure ??= { error };
          return;
        }
        outcome = "delivered";
      }
      if (outcome === "empty") return;
      delivered += 1;
    }
  };
  await Promise.allSettled(Array.from({ length: concurrency }, () => run(lane)));
  // Then the consumer's replays, one at a time: their own lane, after live traffic.
  if (!failure) await run({ ...lane, topic: lane.replayTopic });
  // A one-shot caller (a cron function) may end once this resolves.
  await flushAlerts(consumer, ctx.logger);
  if (failure) throw failure.error;
  return delivered;
}

async function receiveOne(ctx: ModeContext, lane: Lane): Promise<"delivered" | "empty"> {
  let received = 0;
  let notAcknowledged = false;
  // One message per request (`limit: 1`): a received batch would wait leased
  // while the first runs. Read to the end, so the response is consumed.
  for await (const message of lane.api.receiveMessages({
    queueName: lane.topic,
    consumerGroup: lane.group,
    visibilityTimeoutSeconds: ctx.config.visibilityTimeoutSeconds,
    limit: 1,
    // A new consumer group starts at the oldest retained message, whatever the server's default.
    cursorFallback: "earliest",
  })) {
    received += 1;
    const outcome = await ctx.lease.consume(lane, message, false);
    if (outcome === "not_acknowledged") notAcknowledged = true;
  }
  if (notAcknowledged) throw new NotAcknowledged("left to the service's redelivery");
  return received > 0 ? "delivered" : "empty";
}

export class PollWorker implements VercelWorker {
  readonly done: Promise<void>;
  readonly failed: Promise<Error>;
  #inFlight = 0;
  #stopping = false;
  #failure: Error | undefined;
  #authFailures = 0;
  #lastReceiveAt: number | undefined;
  #lastError: string | undefined;
  #resolveFailed: (error: Error) => void = () => {};
  readonly #wakers = new Set<() => void>();

  constructor(
    receive: () => Promise<"delivered" | "empty">,
    options: {
      readonly concurrency: number;
      readonly idleDelayMs: number;
      readonly errorDelayMs: number;
      readonly authAlertAfter: number;
      readonly maxAuthFailures: number;
    },
    clock: Clock,
    incident: (kind: VercelIncident["kind"], message: string, alert: boolean) => void,
    logger: Logger,
    label: string,
  ) {
    this.failed = new Promise((resolve) => {
      this.#resolveFailed = resolve;
    });
    const lane = async () => {
      while (!this.#stopping) {
        let wait = 0;
        this.#inFlight += 1;
        try {
          if ((await receive()) === "empty") wait = options.idleDelayMs;
          this.#authFailures = 0;
          this.#lastReceiveAt = clock.now();
        } catch (error) {
          if (!(error instanceof NotAcknowledged)) {
            // The service or the network failed: back off, the messages stay queued.
            this.#lastError = describeError(error);
            wait = options.errorDelayMs;
            if (authFailure(error)) {
              // Off Vercel, an expired OIDC token can only be refreshed through a
              // linked Vercel CLI: retrying forever would hide a stalled worker
              // while its messages run out of retention.
              this.#authFailures += 1;
              const n = this.#authFailures;
              if (n >= options.maxAuthFailures && !this.#failure) {
                this.#failure = new Error(
                  `vercel worker ${label}: ${n} consecutive auth failures (last: ${this.#lastError}); stopped. Renew the token (VERCEL_OIDC_TOKEN, or options.token) and restart the worker`,
                );
                incident("worker_failed", this.#failure.message, true);
                this.#stopping = true;
                for (const wake of this.#wakers) wake();
                this.#resolveFailed(this.#failure);
              } else if (n === options.authAlertAfter) {
                incident(
                  "auth_failed",
                  `vercel worker ${label}: ${n} consecutive auth failures (${this.#lastError}); it stops after ${options.maxAuthFailures}`,
                  true,
                );
              } else {
                incident("auth_failed", `vercel worker ${label}: receive refused: ${this.#lastError}`, false);
              }
            } else {
              logger.warn(`vercel worker ${label}: receive failed: ${this.#lastError}`);
            }
          }
        } finally {
          this.#inFlight -= 1;
        }
        if (wait > 0 && !this.#stopping) await this.#sleep(wait);
      }
    };
    this.done = Promise.all(Array.from({ length: options.concurrency }, lane)).then(() => {});
    this.#authAlertAfter = options.authAlertAfter;
  }

  readonly #authAlertAfter: number;

  get inFlight(): number {
    return this.#inFlight;
  }

  health(): VercelWorkerHealth {
    const state = this.#failure
      ? "failed"
      : this.#stopping
        ? "stopped"
        : this.#authFailures >= this.#authAlertAfter
          ? "degraded"
          : "running";
    return {
      state,
      consecutiveAuthFailures: this.#authFailures,
      lastReceiveAt: this.#lastReceiveAt,
      lastError: this.#lastError,
    };
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    for (const wake of this.#wakers) wake();
    await this.done;
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#wakers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, timerDelay(ms));
      this.#wakers.add(wake);
    });
  }
}

/** A worker's live and replay poll loops, seen as one worker. */
export class CombinedWorker implements VercelWorker {
  readonly done: Promise<void>;
  readonly failed: Promise<Error>;
  readonly #parts: readonly PollWorker[];

  constructor(parts: readonly PollWorker[]) {
    this.#parts = parts;
    this.done = Promise.all(parts.map((p) => p.done)).then(() => {});
    this.failed = Promise.race(parts.map((p) => p.failed));
    // One loop that can no longer receive fails the worker: the others stop too.
    void this.failed.then(() => this.stop());
  }

  get inFlight(): number {
    return this.#parts.reduce((sum, p) => sum + p.inFlight, 0);
  }

  health(): VercelWorkerHealth {
    // The worst of its loops: one that cannot receive is the worker's state.
    const order = ["failed", "degraded", "running", "stopped"] as const;
    const all = this.#parts.map((p) => p.health());
    return all.reduce((worst, h) => (order.indexOf(h.state) < order.indexOf(worst.state) ? h : worst));
  }

  async stop(): Promise<void> {
    await Promise.all(this.#parts.map((p) => p.stop()));
  }
}
