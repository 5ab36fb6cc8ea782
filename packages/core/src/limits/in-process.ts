/**
 * The in-process rate limiter: the same buckets as the Upstash one (one token
 * every perMs / rate, size 1; all or none, refunds capped at the size; blocks
 * after a provider's 429), in this process's memory — for the embedded demo,
 * tests and a single worker. Across processes, use `upstashRateLimiter`.
 */
import type { RateLimiter, TakeResult, TokenBucket } from "./port.ts";

interface State {
  /** When the bucket's next token is there (ms since the epoch); a token is there now when ≤ now. */
  nextAt: number;
  /** No token before this (a provider's 429). */
  blockedUntil: number;
}

export function inProcessRateLimiter(options: { readonly now?: () => number } = {}): RateLimiter {
  const now = options.now ?? Date.now;
  const states = new Map<string, State>();
  const stateOf = (key: string) => {
    let state = states.get(key);
    if (!state) {
      state = { nextAt: 0, blockedUntil: 0 };
      states.set(key, state);
    }
    return state;
  };
  return {
    async take(buckets: readonly TokenBucket[]): Promise<TakeResult> {
      const t = now();
      // Synchronous from here on: no other take interleaves, so all or none needs no refund.
      for (const bucket of buckets) {
        const state = stateOf(bucket.key);
        const ready = Math.max(state.nextAt, state.blockedUntil);
        if (ready > t) return { ok: false, bucket: bucket.key, retryAfterMs: Math.max(1, Math.ceil(ready - t)) };
      }
      for (const bucket of buckets) {
        const state = stateOf(bucket.key);
        // Size 1: a token that was there for a while does not pile up.
        state.nextAt = Math.max(state.nextAt, t) + bucket.perMs / bucket.rate;
      }
      return { ok: true };
    },
    async block(bucket: TokenBucket, forMs: number): Promise<void> {
      if (!(Number.isFinite(forMs) && forMs > 0)) return;
      const state = stateOf(bucket.key);
      state.blockedUntil = Math.max(state.blockedUntil, now() + forMs);
    },
  };
}
