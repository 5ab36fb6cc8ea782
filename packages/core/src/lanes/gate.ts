/**
 * What the harness does for a consumer on a lane queue (#20 item 2; ADR 0011).
 * - Marketing: before anything else that costs (a rate-limit token, a
 *   connection, a lock, a fence), the delivery yields — a deferral that spends
 *   no attempt and is never dead-lettered — while the channel's transactional
 *   backlog is above the consumer's `yieldAbove`. It comes back in a short,
 *   jittered while (not growing past YIELD_CAP_MS; longer, up to
 *   YIELD_BACKLOG_CAP_MS, while the backlog is long enough to take that to
 *   drain), so marketing resumes soon after the backlog falls. A backlog that cannot be
 *   read defers too: transactional priority is never given up on doubt.
 * - Transactional: a final outcome (success, duplicate, a dead letter) takes
 *   the job out of the backlog. That never changes the outcome; a removal that
 *   fails leaves the entry to go stale (ADR 0011).
 */
import { describeError, InvalidConfigError } from "../errors.ts";
import type { Logger } from "../ports/logger.ts";
import { withinMs } from "../timers.ts";
import type { LaneBacklog } from "./backlog.ts";
import { type Lane, parseLaneQueue } from "./names.ts";

/**
 * The first yield's wait, doubling with the job's deferrals up to
 * YIELD_CAP_MS — or, when the backlog is long, about the time it takes to
 * drain (YIELD_MS_PER_JOB per job, up to YIELD_BACKLOG_CAP_MS) — each plus up
 * to as much again of jitter. A long backlog is not polled by every waiting
 * marketing job each second: that costs the transactional jobs CPU.
 */
export const YIELD_BASE_MS = 200;
export const YIELD_CAP_MS = 1_000;
export const YIELD_MS_PER_JOB = 1;
export const YIELD_BACKLOG_CAP_MS = 5_000;

export type LaneAdmission =
  | { readonly ok: true }
  | { readonly ok: false; readonly yielded: true; readonly retryAfterMs: number; readonly error: string }
  | { readonly ok: false; readonly yielded: false; readonly error: string };

export class LaneGate {
  readonly channel: string;
  readonly lane: Lane;
  readonly #consumer: string;
  readonly #backlog: LaneBacklog;
  readonly #yieldAbove: number;
  readonly #timeoutMs: number;
  readonly #random: () => number;
  readonly #logger: Logger;
  #read: { readonly at: number; readonly size: Promise<number> } | undefined;

  /** The gate of a consumer on a lane queue; undefined for any other queue. */
  static of(
    consumer: {
      readonly name: string;
      readonly queue: string;
      readonly yieldAbove?: number;
      readonly timeoutMs: number;
    },
    backlog: LaneBacklog | undefined,
    random: () => number,
    logger: Logger,
  ): LaneGate | undefined {
    const lane = parseLaneQueue(consumer.queue);
    if (lane === undefined) return undefined;
    if (backlog === undefined) {
      throw new InvalidConfigError(
        `consumer "${consumer.name}": its queue ${consumer.queue} is a ${lane.lane} lane, so bindConsumer needs a laneBacklog (upstashLaneBacklog across processes, inProcessLaneBacklog in one): ${lane.lane === "marketing" ? "it yields to the channel's transactional backlog" : "its final outcomes take jobs out of the channel's backlog"}`,
      );
    }
    return new LaneGate(
      consumer.name,
      lane.channel,
      lane.lane,
      backlog,
      consumer.yieldAbove ?? 0,
      consumer.timeoutMs,
      random,
      logger,
    );
  }

  private constructor(
    consumer: string,
    channel: string,
    lane: Lane,
    backlog: LaneBacklog,
    yieldAbove: number,
    timeoutMs: number,
    random: () => number,
    logger: Logger,
  ) {
    this.#consumer = consumer;
    this.channel = channel;
    this.lane = lane;
    this.#backlog = backlog;
    this.#yieldAbove = yieldAbove;
    this.#timeoutMs = timeoutMs;
    this.#random = random;
    this.#logger = logger;
  }

  /** Whether a marketing delivery may go on now; always for a transactional one. */
  async admit(deferrals: number, ms = this.#timeoutMs): Promise<LaneAdmission> {
    if (this.lane !== "marketing") return { ok: true };
    let size: number;
    try {
      // The read is shared by the deliveries that ask meanwhile, each waiting at most what it has left.
      size = await withinMs(this.#size(), ms, () => new Error(`no answer within ${ms} ms`));
    } catch (error) {
      return { ok: false, yielded: false, error: `lane backlog unavailable: ${describeError(error)}` };
    }
    if (size <= this.#yieldAbove) return { ok: true };
    const backoff = Math.min(YIELD_CAP_MS, YIELD_BASE_MS * 2 ** Math.min(Math.max(0, deferrals), 10));
    const base = Math.max(backoff, Math.min(YIELD_BACKLOG_CAP_MS, size * YIELD_MS_PER_JOB));
    return {
      ok: false,
      yielded: true,
      retryAfterMs: Math.ceil(base + this.#random() * base),
      error: `yielded to notif.${this.channel}.transactional: ${size} jobs in its backlog, above ${this.#yieldAbove}`,
    };
  }

  /** A transactional job reached a final outcome: out of the backlog. Never throws. */
  async settled(jobId: string, ms = this.#timeoutMs): Promise<void> {
    if (this.lane !== "transactional") return;
    try {
      await withinMs(this.#backlog.remove(this.channel, jobId), ms, () => new Error(`no answer within ${ms} ms`));
    } catch (error) {
      this.#logger.warn?.(
        `consumer "${this.#consumer}": job ${jobId} could not be taken out of the ${this.channel} transactional backlog (it goes stale instead): ${describeError(error)}`,
      );
    }
  }

  /** One read of the backlog per `refreshMs`, shared by the deliveries that ask meanwhile. */
  #size(): Promise<number> {
    const now = performance.now();
    const read = this.#read;
    if (read !== undefined && now - read.at < this.#backlog.refreshMs) return read.size;
    const size = withinMs(
      this.#backlog.size(this.channel),
      this.#timeoutMs,
      () => new Error(`no answer within ${this.#timeoutMs} ms`),
    );
    this.#read = { at: now, size };
    // A failed read is not reused: the next delivery asks again.
    size.catch(() => {
      if (this.#read?.size === size) this.#read = undefined;
    });
    return size;
  }
}
