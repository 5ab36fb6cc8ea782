/**
 * The Upstash adapter of the rate-limiter port (#20, SPEC §7; ADR 0010): one
 * Lua script over `@upstash/redis`, shared by every process and every function
 * instance that uses the same Redis and prefix.
 *
 * - A bucket of `rate` per `perMs` is a bucket of size 1 refilled every
 *   `interval` = `perMs / rate` × (1 + `headroom`), kept as its next free
 *   instant (a "theoretical arrival time", GCRA) in `<prefix>:bucket:<key>`:
 *   two tokens of one bucket are always at least `interval` apart, so no
 *   window of `perMs` holds more than `rate` of them. (`@upstash/ratelimit`'s
 *   token bucket refills on a grid and does not guarantee that: ADR 0010.)
 * - `take()` is one script call: it reads every bucket's next free instant and
 *   block, and takes a token from all of them or from none — nothing is taken
 *   and given back, so nothing can be given back past a bucket's size.
 * - `block()` sets `<prefix>:block:<key>` with a PX expiry, never shortening
 *   a longer block already there.
 * - Nothing is let through on doubt: a Redis or HTTP error, or no answer
 *   within `timeoutMs`, throws (the caller defers).
 */
import type { Redis } from "@upstash/redis";
import type { RateLimiter, TakeResult, TokenBucket } from "./port.ts";

export interface UpstashRateLimiterOptions {
  /** An `@upstash/redis` client (`Redis.fromEnv()` on Vercel). */
  readonly redis: Redis;
  /** Prefix of every key this limiter writes; default `softcrum:limits`. */
  readonly prefix?: string;
  /** Bound on each `take()` and `block()`, in ms; past it they throw. Default 2 000. */
  readonly timeoutMs?: number;
  /**
   * Spacing added to every bucket's interval, as a fraction (default 0.05: a
   * 10/s bucket gives a token every 105 ms). Slack for the time between a
   * token's decision and the provider seeing the call it allowed, which
   * varies by a few ms to tens of ms per call; 0 spaces tokens exactly.
   */
  readonly headroom?: number;
}

/** `take()` or `block()` got an error from Upstash, or no answer within `timeoutMs`. */
export class RateLimiterUnavailableError extends Error {
  override readonly name = "RateLimiterUnavailableError";
}

export const DEFAULT_UPSTASH_LIMITS_PREFIX = "softcrum:limits";
export const DEFAULT_UPSTASH_LIMITS_TIMEOUT_MS = 2_000;
export const DEFAULT_UPSTASH_LIMITS_HEADROOM = 0.05;

/** A bucket's interval between tokens: `perMs / rate` × (1 + headroom), in whole ms (at least 1). */
export function upstashIntervalMs(
  bucket: Pick<TokenBucket, "rate" | "perMs">,
  headroom = DEFAULT_UPSTASH_LIMITS_HEADROOM,
): number {
  return Math.max(1, Math.ceil((bucket.perMs / bucket.rate) * (1 + headroom)));
}

// How long a bucket key outlives its next free instant: a missing key must
// mean "free" for every caller, even one whose clock is somewhat behind.
const KEY_GRACE_MS = 60_000;

// KEYS[1..n]: the buckets' keys (their next free instant, ms); KEYS[n+1..2n]:
// their block keys. ARGV[1]: now, the caller's clock in ms (Upstash asks that
// scripts take time as an argument, not from the server's clock); ARGV[2]:
// KEY_GRACE_MS; ARGV[2+i]: bucket i's interval. All or none: returns {0, 0}
// after taking a token from every bucket, else {i, wait} for the first
// bucket i (in the caller's order) without a token now, taking nothing. A
// block key without an expiry (not written by block()) counts as a 1 s block.
const TAKE = `#!lua flags=allow-key-locking
local n = #KEYS / 2
local now = tonumber(ARGV[1])
local grace = tonumber(ARGV[2])
for i = 1, n do
  local wait = 0
  local ttl = redis.call("PTTL", KEYS[n + i])
  if ttl == -1 then wait = 1000 elseif ttl > 0 then wait = ttl end
  local free = tonumber(redis.call("GET", KEYS[i]))
  if free ~= nil and free - now > wait then wait = free - now end
  if wait > 0 then return {i, wait} end
end
for i = 1, n do
  local interval = tonumber(ARGV[2 + i])
  redis.call("SET", KEYS[i], now + interval, "PX", interval + grace)
end
return {0, 0}`;

// Blocks for ARGV[1] ms unless a block at least as long is already there. 1 when set.
const BLOCK = `#!lua flags=allow-key-locking
local ttl = redis.call("PTTL", KEYS[1])
local ms = tonumber(ARGV[1])
if ttl == -1 or ttl >= ms then return 0 end
redis.call("SET", KEYS[1], "1", "PX", ms)
return 1`;

function checkBuckets(buckets: readonly TokenBucket[]): void {
  const keys = new Set<string>();
  for (const bucket of buckets) {
    if (typeof bucket.key !== "string" || bucket.key.length === 0) throw new TypeError("a bucket needs a key");
    if (!Number.isFinite(bucket.rate) || bucket.rate <= 0) {
      throw new RangeError(`bucket ${bucket.key}: rate must be > 0`);
    }
    if (!Number.isFinite(bucket.perMs) || bucket.perMs <= 0) {
      throw new RangeError(`bucket ${bucket.key}: perMs must be > 0`);
    }
    if (keys.has(bucket.key)) throw new TypeError(`bucket ${bucket.key} appears twice in one take`);
    keys.add(bucket.key);
  }
}

export function upstashRateLimiter(options: UpstashRateLimiterOptions): RateLimiter {
  const { redis } = options;
  const prefix = options.prefix ?? DEFAULT_UPSTASH_LIMITS_PREFIX;
  const timeoutMs = options.timeoutMs ?? DEFAULT_UPSTASH_LIMITS_TIMEOUT_MS;
  const headroom = options.headroom ?? DEFAULT_UPSTASH_LIMITS_HEADROOM;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) throw new RangeError("timeoutMs must be > 0");
  if (!Number.isFinite(headroom) || headroom < 0) throw new RangeError("headroom must be >= 0");
  const bucketKey = (bucket: TokenBucket) => `${prefix}:bucket:${bucket.key}`;
  const blockKey = (bucket: TokenBucket) => `${prefix}:block:${bucket.key}`;
  // EVALSHA, and EVAL once when Redis does not know the script yet.
  const takeScript = redis.createScript<unknown>(TAKE);
  const blockScript = redis.createScript<unknown>(BLOCK);

  /** Runs `work` within `timeoutMs`; any failure, or no answer in time, is a RateLimiterUnavailableError. */
  async function bounded<T>(what: string, work: () => Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const expiry = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new RateLimiterUnavailableError(`${what}: no answer from Upstash within ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      return await Promise.race([work(), expiry]);
    } catch (error) {
      if (error instanceof RateLimiterUnavailableError) throw error;
      const message = error instanceof Error ? error.message : String(error);
      throw new RateLimiterUnavailableError(`${what}: ${message}`, { cause: error });
    } finally {
      clearTimeout(timer);
    }
  }

  return {
    async take(buckets) {
      checkBuckets(buckets);
      if (buckets.length === 0) return { ok: true };
      // The decision's instant, read before anything can wait.
      const now = Date.now();
      return bounded("take", async (): Promise<TakeResult> => {
        const answer = await takeScript.exec(
          [...buckets.map(bucketKey), ...buckets.map(blockKey)],
          [String(now), String(KEY_GRACE_MS), ...buckets.map((bucket) => String(upstashIntervalMs(bucket, headroom)))],
        );
        const [refused, waitMs] = Array.isArray(answer) ? answer.map(Number) : [];
        if (refused === undefined || waitMs === undefined || !Number.isInteger(refused) || !Number.isFinite(waitMs)) {
          throw new Error(`unexpected answer to the take script: ${JSON.stringify(answer)}`);
        }
        if (refused === 0) return { ok: true };
        const bucket = buckets[refused - 1];
        if (!bucket) throw new Error(`the take script refused bucket #${refused} of ${buckets.length}`);
        // The wait counts from the decision's instant; the caller counts from now.
        return { ok: false, bucket: bucket.key, retryAfterMs: Math.max(1, Math.ceil(now + waitMs - Date.now())) };
      });
    },

    async block(bucket, forMs) {
      checkBuckets([bucket]);
      // Nothing to wait for (as in the in-process limiter).
      if (!Number.isFinite(forMs) || forMs <= 0) return;
      await bounded("block", () => blockScript.exec([blockKey(bucket)], [String(Math.ceil(forMs))]));
    },
  };
}
