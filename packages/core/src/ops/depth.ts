import { type Clock, systemClock } from "../clock.ts";

/** Pending dead letters of one queue and consumer, as `DeadLetterOperations.depth()` reads them. */
export interface DepthRow {
  readonly queue: string;
  readonly consumer: string;
  readonly pending: number;
  readonly oldestPendingAgeMs: number;
}

export interface CachedDepthOptions {
  /** A result younger than this is reused instead of querying again. @default 30_000 */
  readonly maxAgeMs?: number;
  /** @default the system clock */
  readonly clock?: Clock;
}

/**
 * The depth read for gauges, once per interval per process (#9 item 11):
 * concurrent calls (several metric readers collecting at once) share one
 * query, and a result younger than `maxAgeMs` is reused, its ages moved on by
 * the time since it was read. A failed read is not kept: the next call tries
 * again. Operators' own reads (`ops.deadLetters.depth()`) stay uncached.
 */
export function cachedDepth(
  read: () => Promise<readonly DepthRow[]>,
  options: CachedDepthOptions = {},
): () => Promise<DepthRow[]> {
  const maxAgeMs = options.maxAgeMs ?? 30_000;
  const clock = options.clock ?? systemClock;
  type Reading = { readonly at: number; readonly rows: readonly DepthRow[] };
  let cached: Reading | undefined;
  let inFlight: Promise<Reading> | undefined;
  const aged = ({ at, rows }: Reading) => {
    const elapsed = Math.max(0, clock.now() - at);
    return rows.map((r) => ({ ...r, oldestPendingAgeMs: r.oldestPendingAgeMs + elapsed }));
  };
  return async () => {
    if (cached && clock.now() - cached.at < maxAgeMs) return aged(cached);
    inFlight ??= (async () => {
      const at = clock.now();
      try {
        const reading = { at, rows: await Promise.resolve().then(read) };
        cached = reading;
        return reading;
      } finally {
        inFlight = undefined;
      }
    })();
    return aged(await inFlight);
  };
}
