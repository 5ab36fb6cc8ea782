import { InvalidConfigError } from "./errors.ts";

/**
 * When a transient failure is retried. The platform default (seed 001) is
 * 5 attempts, base 30 s, cap 1 h; overriding it for a queue needs a written
 * justification in that module's spec.
 */
export interface RetryPolicy {
  /** Runs of the handler in all, the first included. @default 5 */
  readonly maxAttempts: number;
  /** Delay scale: the ceiling of the first retry's delay. @default 30_000 */
  readonly baseDelayMs: number;
  /** No delay exceeds this. @default 3_600_000 */
  readonly maxDelayMs: number;
}

export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  maxAttempts: 5,
  baseDelayMs: 30_000,
  maxDelayMs: 3_600_000,
});

/**
 * Fills in defaults and refuses a policy that breaks the spec's guarantee
 * that each retry waits longer than the one before. With equal jitter that
 * holds exactly while the un-jittered delay doubles, i.e. while
 * base·2^(maxAttempts−2) stays within the cap.
 */
export function resolveRetryPolicy(overrides: Partial<RetryPolicy> | undefined, owner: string): RetryPolicy {
  const policy = { ...DEFAULT_RETRY_POLICY, ...overrides };
  const { maxAttempts, baseDelayMs, maxDelayMs } = policy;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 100) {
    throw new InvalidConfigError(`${owner}: retry.maxAttempts must be an integer from 1 to 100, got ${maxAttempts}`);
  }
  if (!Number.isFinite(baseDelayMs) || baseDelayMs <= 0) {
    throw new InvalidConfigError(`${owner}: retry.baseDelayMs must be a positive number, got ${baseDelayMs}`);
  }
  if (!Number.isFinite(maxDelayMs) || maxDelayMs < baseDelayMs) {
    throw new InvalidConfigError(
      `${owner}: retry.maxDelayMs must be a number >= baseDelayMs (${baseDelayMs}), got ${maxDelayMs}`,
    );
  }
  const largestUncapped = baseDelayMs * 2 ** Math.max(0, maxAttempts - 2);
  if (largestUncapped > maxDelayMs) {
    throw new InvalidConfigError(
      `${owner}: retry policy would stop growing its intervals: the last retry's ceiling ` +
        `base ${baseDelayMs} ms × 2^${maxAttempts - 2} = ${largestUncapped} ms exceeds the cap ${maxDelayMs} ms; ` +
        "lower maxAttempts or baseDelayMs, or raise maxDelayMs",
    );
  }
  return Object.freeze(policy);
}

/**
 * Delay before the retry that follows failed attempt `attempt` (1-based), with
 * equal jitter: uniform in [e/2, e) where e = min(cap, base·2^(attempt−1)).
 * `random` returns a number in [0, 1) like Math.random.
 */
export function retryDelayMs(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  return Math.floor(ceiling / 2 + random() * (ceiling / 2));
}

/**
 * The longest time a job can spend between its first delivery and its last
 * retry (the sum of the largest possible delays). A processed_jobs TTL must
 * exceed this with margin, or a late retry would find no fence and run twice.
 */
export function maxRetryWindowMs(policy: RetryPolicy): number {
  let total = 0;
  for (let attempt = 1; attempt < policy.maxAttempts; attempt++) {
    total += Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  }
  return total;
}

/** How deliveries that must wait without spending an attempt back off (see `deferralDelayMs`). */
export interface DeferralBackoff {
  /** Ceiling of the first wait (the first wait is in [base/2, base]). */
  readonly baseMs: number;
  /** No computed wait exceeds this (a provider's Retry-After may). */
  readonly capMs: number;
  /** No wait is shorter than this, whatever a provider said. @default 1_000 */
  readonly floorMs?: number;
}

/**
 * The harness's backoff for rate-limited deliveries: base 30 s (the first
 * wait is 15–30 s), cap 15 min, floor 1 s. Without a Retry-After each
 * consecutive deferral of a job doubles the ceiling of its wait; with one,
 * the provider's wait is honoured but never below the floor.
 */
export const RATE_LIMIT_BACKOFF: Required<DeferralBackoff> = Object.freeze({
  baseMs: 30_000,
  capMs: 900_000,
  floorMs: 1_000,
});

/**
 * A consumer's default deferral horizon (`deferralHorizonMs`), 12 h: no
 * rate-limited wait is longer, and a delivery whose handler never started is
 * not deferred past this long after the job became due (it is dead-lettered
 * instead). It bounds how late a copy of a job can come back, which the fence
 * cleanup's TTL must cover (ADR 0006).
 */
export const DEFAULT_DEFERRAL_HORIZON_MS = 12 * 3_600_000;

/** Shortest wait of a deferral when the options name none: `Retry-After: 0` must not make a hot loop. */
export const DEFERRAL_FLOOR_MS = 1_000;

/**
 * Delay before the next delivery of a message that was deferred without
 * spending an attempt (rate limited, or the handler never started), after
 * `deferrals` earlier deferrals (`Delivery.deferrals`). Equal jitter,
 * growing exponentially: uniform in [e/2, e) where e = min(cap, base·2^deferrals).
 * A provider's `retryAfterMs` (Retry-After), when given, is honoured instead.
 * Either way the result is never below `floorMs` (@default 1_000), so
 * `Retry-After: 0` or a date in the past cannot make a hot loop.
 * `random` returns a number in [0, 1) like Math.random.
 */
export function deferralDelayMs(
  deferrals: number,
  options: DeferralBackoff & { readonly retryAfterMs?: number | undefined },
  random: () => number = Math.random,
): number {
  const { baseMs, capMs, retryAfterMs } = options;
  const floorMs = options.floorMs ?? DEFERRAL_FLOOR_MS;
  if (!(Number.isFinite(baseMs) && baseMs > 0 && Number.isFinite(capMs) && capMs >= baseMs)) {
    throw new InvalidConfigError(`deferral backoff needs 0 < baseMs <= capMs, got base ${baseMs}, cap ${capMs}`);
  }
  if (!(Number.isFinite(floorMs) && floorMs >= 0)) {
    throw new InvalidConfigError(`deferral backoff floorMs must be a non-negative number, got ${floorMs}`);
  }
  if (retryAfterMs !== undefined && Number.isFinite(retryAfterMs)) {
    return Math.max(floorMs, Math.ceil(retryAfterMs));
  }
  const n = Number.isInteger(deferrals) && deferrals > 0 ? deferrals : 0;
  const ceiling = Math.min(capMs, baseMs * 2 ** n);
  return Math.max(floorMs, Math.floor(ceiling / 2 + random() * (ceiling / 2)));
}
