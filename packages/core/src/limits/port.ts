/**
 * The rate-limiter port (#20, SPEC §7): token buckets a consumer's deliveries
 * take from before their work transaction opens. A provider's bucket is one
 * for every tenant and every process (a mail provider's 10 requests/s are per
 * team); a tenant's bucket gives fair use. Adapters: `inProcessRateLimiter`
 * (one process: the embedded demo, tests) and `upstashRateLimiter`
 * (`@softcrum/core/limits/upstash`, every process of a fleet; ADR 0010).
 */

/** One bucket: at most `rate` tokens in any window of `perMs` — one token every `perMs / rate`, no burst. */
export interface TokenBucket {
  /** The bucket's name, the same in every process: `provider:<name>` or `tenant:<name>:<tenant_id>`. */
  readonly key: string;
  readonly rate: number;
  readonly perMs: number;
}

export type TakeResult =
  | { readonly ok: true }
  | {
      readonly ok: false;
      /** The bucket that refused. */
      readonly bucket: string;
      /** When it has a token again (or its block ends), from now; at least 1. */
      readonly retryAfterMs: number;
    };

export interface RateLimiter {
  /**
   * Takes one token from each bucket, in order, all or none: when one
   * refuses, the tokens taken from the buckets before it are given back —
   * never past a bucket's size. Throws when the limiter cannot answer (its
   * store is down or slow): the caller defers, it never lets the call through.
   */
  take(buckets: readonly TokenBucket[]): Promise<TakeResult>;
  /**
   * No token from `bucket` for `forMs` (its provider answered 429): every
   * process waits at once, instead of each finding out by its own 429.
   */
  block(bucket: TokenBucket, forMs: number): Promise<void>;
}
