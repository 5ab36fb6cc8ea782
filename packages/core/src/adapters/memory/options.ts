/**
 * The in-process queue's options: what a caller may set, the defaults, and
 * the checks every option passes before a queue exists.
 */
import { type Clock, systemClock } from "../../clock.ts";
import { nonNegative, positive, positiveInteger } from "../../validate.ts";

export interface MemoryQueueOptions {
  /** @default the system clock; pass `createManualClock()` so backoff takes no real time. */
  readonly clock?: Clock;
  /** Deliveries in flight at once, per subscribed consumer. @default 4 */
  readonly concurrency?: number;
  /**
   * Replays in flight at once, per subscribed consumer, on its replay lane
   * (`publishReplay`), apart from `concurrency`: a bulk replay never takes
   * the slots live messages use (SPEC §5). @default 1
   */
  readonly replayConcurrency?: number;
  /**
   * When a delivery neither acks nor asks for a delay (or throws), it comes
   * back after this. A delivery still unsettled this long after it started
   * is treated like a crash: the message comes back at once (its delivery
   * count one higher), and a late result of the abandoned delivery is
   * ignored. A consumer's whole delivery (`deliveryBoundMs`: 2 × timeoutMs + 5 s)
   * must be below it. Clock time. @default 60_000 (above the 55 s of a consumer's default 25 s timeoutMs)
   */
  readonly visibilityTimeoutMs?: number;
  /**
   * Longest `close()` waits for deliveries in flight before it returns
   * without them. Real time. @default 30_000
   */
  readonly closeTimeoutMs?: number;
  /**
   * Manual clock only (it moves only when told, so a visibility timeout never
   * passes by itself): a delivery still unsettled after this much real time
   * counts as stuck, and `drain()` moves the clock on (to its visibility
   * timeout, which redelivers it) instead of waiting for it. @default 10_000
   */
  readonly stuckAfterMs?: number;
  /** How long an `idempotencyKey` suppresses another publish with the same key. @default 86_400_000 (24 h, like Vercel Queues) */
  readonly dedupWindowMs?: number;
}

/** The options once checked, every default filled in. */
export interface MemoryQueueSettings {
  readonly clock: Clock;
  readonly concurrency: number;
  readonly replayConcurrency: number;
  readonly visibilityTimeoutMs: number;
  readonly closeTimeoutMs: number;
  readonly stuckAfterMs: number;
  readonly dedupWindowMs: number;
}

/** Checks the options in this order (the first bad one throws `InvalidConfigError`) and fills in the defaults. */
export function resolveOptions(options: MemoryQueueOptions): MemoryQueueSettings {
  return {
    clock: options.clock ?? systemClock,
    concurrency: positiveInteger(options.concurrency ?? 4, "concurrency"),
    replayConcurrency: positiveInteger(options.replayConcurrency ?? 1, "replayConcurrency"),
    visibilityTimeoutMs: positive(options.visibilityTimeoutMs ?? 60_000, "visibilityTimeoutMs"),
    closeTimeoutMs: nonNegative(options.closeTimeoutMs ?? 30_000, "closeTimeoutMs"),
    stuckAfterMs: nonNegative(options.stuckAfterMs ?? 10_000, "stuckAfterMs"),
    dedupWindowMs: nonNegative(options.dedupWindowMs ?? 86_400_000, "dedupWindowMs"),
  };
}
