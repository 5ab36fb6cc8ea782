/**
 * Running jobs through bound consumers in a test: the in-process queue on a
 * manual clock, so a whole retry schedule (backoff of seconds to hours) runs
 * in no real time, with every delivery recorded.
 */
import { AssertionError } from "node:assert";
import { createMemoryQueue, type MemoryQueue, type MemoryQueueOptions } from "../adapters/memory/index.ts";
import { createManualClock, type ManualClock } from "../clock.ts";
import type { Envelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import type {
  BoundConsumer,
  Delivery,
  DeliveryOutcome,
  DeliveryResult,
  PublishOptions,
  PublishReceipt,
} from "../queue-port.ts";

/** How far `drain()` moves the clock at most, by default: past the harness's longest deferral horizon (12 h). */
export const DEFAULT_DRAIN_MAX_MS = 24 * 3_600_000;

export interface TestQueueOptions extends Omit<MemoryQueueOptions, "clock"> {
  /** Subscribed at once, each on its own queue (`BoundConsumer.queue`). */
  readonly consumers: readonly BoundConsumer[];
  /**
   * The clock the queue runs on. Bind the consumers with `now: clock.now` so
   * their `maxAgeMs` sees the same time. @default createManualClock()
   */
  readonly clock?: ManualClock;
}

/** One finished delivery. */
export interface TestDelivery {
  readonly queue: string;
  readonly consumer: string;
  readonly messageId: string;
  /** The envelope's job_id, when it went through `publish`/`deliverTwice`. */
  readonly jobId: string | undefined;
  readonly deliveryCount: number;
  /** Clock time the delivery started. */
  readonly at: number;
  readonly lane: "live" | "replay";
  /** The harness's outcome, or `thrown` when `deliver` threw (redelivered after the visibility timeout). */
  readonly outcome: DeliveryOutcome | "thrown";
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
}

/** What a drain (or `advance`, `deliverTwice`) ran. */
export interface DrainReport {
  /** The deliveries that finished meanwhile, in order. */
  readonly deliveries: readonly TestDelivery[];
  /** Their outcomes, in order, e.g. `["retry", "retry", "success"]`. */
  readonly outcomes: readonly (DeliveryOutcome | "thrown")[];
  /** Messages not acknowledged yet. */
  readonly pending: number;
  /** How far the clock moved meanwhile. */
  readonly elapsedMs: number;
}

/** Where a test publishes: `queue` may be left out when every consumer reads the same one. */
export type TestPublishOptions = PublishOptions & { readonly queue?: string };

export interface TestQueue {
  readonly clock: ManualClock;
  /** The in-process queue underneath, for what the helpers do not cover. */
  readonly queue: MemoryQueue;
  /** Every delivery that finished so far. */
  readonly deliveries: readonly TestDelivery[];
  /** Publishes an envelope (validated), now or after `delayMs`. */
  publish(envelope: Envelope, options?: TestPublishOptions): Promise<PublishReceipt>;
  /** Publishes a body without validating it: a corrupt message, a producer on another stack. */
  publishRaw(body: string | Uint8Array, options?: TestPublishOptions): Promise<PublishReceipt>;
  /**
   * Runs deliveries until every message is acknowledged, moving the clock to
   * each next due delivery (retries, deferrals, delayed publishes). Throws an
   * AssertionError when messages are still pending once the clock has moved
   * `maxMs` (a job that never settles). @default maxMs DEFAULT_DRAIN_MAX_MS
   */
  drain(options?: { readonly maxMs?: number }): Promise<DrainReport>;
  /** Moves the clock `ms` forward, running every delivery due on the way; what is due later stays pending. */
  advance(ms: number): Promise<DrainReport>;
  /**
   * Delivers the same envelope twice, as an at-least-once transport may: it
   * is published and drained, then published and drained again (both copies
   * at once with `concurrently`). The second must come back `duplicate`.
   */
  deliverTwice(
    envelope: Envelope,
    options?: TestPublishOptions & { readonly concurrently?: boolean },
  ): Promise<DrainReport>;
  /** The outcomes of every delivery of `jobId` so far, in order. */
  outcomesOf(jobId: string): (DeliveryOutcome | "thrown")[];
  /** Stops the queue (waits for deliveries in flight). */
  close(): Promise<void>;
}

/** Thrown through the queue's own drain when it would move the clock past the bound. */
class ClockBound extends Error {
  constructor(readonly next: number) {
    super("the clock bound of this drain was reached");
  }
}

/**
 * An in-process queue on a manual clock with `consumers` subscribed, for
 * tests: publish jobs, `drain()` them through their whole retry schedule,
 * and read what each delivery did.
 *
 * @example
 * const clock = createManualClock();
 * const t = createTestQueue({ clock, consumers: [bindConsumer(awardPoints, { db, now: clock.now })] });
 * await t.publish(envelope);
 * expect((await t.drain()).outcomes).toEqual(["retry", "retry", "success"]);
 */
export function createTestQueue(options: TestQueueOptions): TestQueue {
  const { consumers, clock: given, ...queueOptions } = options;
  if (!Array.isArray(consumers) || consumers.length === 0) {
    throw new InvalidConfigError("createTestQueue needs at least one consumer from bindConsumer()");
  }
  const clock = given ?? createManualClock();
  let bound: number | undefined;
  // The queue's drain moves the clock through advanceTo: past the bound, this throws out of it.
  const bounded: ManualClock = {
    now: () => clock.now(),
    advance: (ms) => clock.advance(ms),
    advanceTo(epochMs) {
      if (bound !== undefined && epochMs > bound) throw new ClockBound(epochMs);
      clock.advanceTo(epochMs);
    },
    onAdvance: (listener) => clock.onAdvance(listener),
  };
  const queue = createMemoryQueue({ ...queueOptions, clock: bounded });
  for (const consumer of consumers) queue.subscribe(consumer);
  const queues = [...new Set(consumers.map((c) => c.queue))];
  const jobOf = new Map<string, string>();
  const deliveries: TestDelivery[] = [];
  queue.onDelivery((event) =>
    deliveries.push({ ...event, jobId: jobOf.get(event.messageId), outcome: event.result.outcome }),
  );

  const queueFor = (options: TestPublishOptions | undefined): string => {
    if (options?.queue) return options.queue;
    if (queues.length === 1) return queues[0] as string;
    throw new InvalidConfigError(
      `the consumers read ${queues.length} queues (${queues.join(", ")}): say which with { queue }`,
    );
  };
  const publishOptions = (options: TestPublishOptions | undefined): PublishOptions | undefined => {
    if (!options) return undefined;
    const {
      queue: _queue,
      concurrently: _concurrently,
      ...rest
    } = options as TestPublishOptions & {
      readonly concurrently?: boolean;
    };
    return rest;
  };
  const publish = async (envelope: Envelope, options?: TestPublishOptions) => {
    const receipt = await queue.publish(queueFor(options), envelope, publishOptions(options));
    if (receipt.messageId) jobOf.set(receipt.messageId, envelope.job_id);
    return receipt;
  };
  /** Runs the queue's drain with the clock bounded at `limit`; the next due time past it, if one stopped it. */
  const runUntil = async (limit: number): Promise<number | undefined> => {
    bound = limit;
    try {
      await queue.drain();
      return undefined;
    } catch (error) {
      if (error instanceof ClockBound) return error.next;
      throw error;
    } finally {
      bound = undefined;
    }
  };
  const report = (from: number, start: number): DrainReport => {
    const ran = deliveries.slice(from);
    return {
      deliveries: ran,
      outcomes: ran.map((d) => d.outcome),
      pending: queue.pending(),
      elapsedMs: clock.now() - start,
    };
  };
  const drain = async (options?: { readonly maxMs?: number }): Promise<DrainReport> => {
    const maxMs = options?.maxMs ?? DEFAULT_DRAIN_MAX_MS;
    if (!(maxMs >= 0)) throw new InvalidConfigError(`drain: maxMs must be a non-negative number, got ${maxMs}`);
    const [from, start] = [deliveries.length, clock.now()];
    const next = await runUntil(start + maxMs);
    const result = report(from, start);
    if (next !== undefined) {
      throw new AssertionError({
        message:
          `drain: ${result.pending} message(s) still pending after ${maxMs} ms of clock time ` +
          `(${result.deliveries.length} deliveries: ${result.outcomes.join(", ") || "none"}); the next is due ` +
          `${next - start} ms after the drain began. Raise maxMs, or use advance(ms) to run part of the schedule.`,
      });
    }
    return result;
  };

  return {
    clock,
    queue,
    deliveries,
    publish,
    async publishRaw(body, options) {
      return queue.publishRaw(queueFor(options), body, publishOptions(options));
    },
    drain,
    async advance(ms) {
      if (!(Number.isFinite(ms) && ms >= 0)) {
        throw new InvalidConfigError(`advance: ms must be a non-negative number, got ${ms}`);
      }
      const [from, start] = [deliveries.length, clock.now()];
      await runUntil(start + ms);
      clock.advanceTo(start + ms);
      // Whatever came due exactly at the end runs too.
      await runUntil(start + ms);
      return report(from, start);
    },
    async deliverTwice(envelope, options) {
      const [from, start] = [deliveries.length, clock.now()];
      if (options?.concurrently) {
        await publish(envelope, options);
        await publish(envelope, options);
        await drain();
      } else {
        await publish(envelope, options);
        await drain();
        await publish(envelope, options);
        await drain();
      }
      return report(from, start);
    },
    outcomesOf: (jobId) => deliveries.filter((d) => d.jobId === jobId).map((d) => d.outcome),
    close: () => queue.close(),
  };
}

/**
 * One delivery of `envelope` straight to a bound consumer, without a queue:
 * the harness's result. `delivery` sets the rest (e.g. `deliveryCount: 5`
 * for the last attempt). @default deliveryCount 1
 */
export function deliver(
  consumer: BoundConsumer,
  envelope: Envelope | string,
  delivery: Partial<Delivery> = {},
): Promise<DeliveryResult> {
  const body = typeof envelope === "string" ? envelope : JSON.stringify(envelope);
  return consumer.deliver({ body, deliveryCount: 1, ...delivery });
}
