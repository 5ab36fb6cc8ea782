/**
 * The fence TTL's law (ADR 0006): how long a copy of a job can stay away from
 * the fence while another copy commits, and the refusal of a TTL shorter than
 * that. Every way the cleanup removes fences — deleted in batches, or dropped
 * with their day partition (ADR 0014) — is bound by the TTL checked here.
 */
import type { Consumer } from "../consumer.ts";
import { InvalidConfigError } from "../errors.ts";
import { DEFAULT_DEFERRAL_HORIZON_MS, maxRetryWindowMs } from "../retry.ts";

/** What the TTL check reads of a consumer; `deferralHorizonMs` @default DEFAULT_DEFERRAL_HORIZON_MS (as `defineConsumer`). */
export type FenceTtlConsumer = Pick<Consumer, "name" | "retryPolicy"> & Partial<Pick<Consumer, "deferralHorizonMs">>;

/** What the TTL is checked against. */
export interface FenceTtlOptions {
  /**
   * Fence rows older than this are deleted. Must be at least every consumer's
   * retry window times `safetyMargin`, plus its deferral horizon, plus
   * `transportHoldMs` (`minimumFenceTtlMs`).
   */
  readonly ttlMs: number;
  /** Every consumer whose fences live in this database: the TTL is checked against each. */
  readonly consumers: readonly FenceTtlConsumer[];
  /** How many times the longest retry window the TTL must cover. @default 2 */
  readonly safetyMargin?: number;
  /**
   * How long the transport may hold a copy of a message beyond the retry
   * schedule (a deferral, the provider's own redelivery): added to the minimum
   * TTL. @default 0 (the in-process adapter); for Vercel Queues, its horizon.
   */
  readonly transportHoldMs?: number;
}

type TtlBoundOptions = Pick<FenceTtlOptions, "consumers" | "safetyMargin" | "transportHoldMs">;

/** One consumer's share of the minimum TTL, with the numbers an error message names. */
interface ConsumerTtlBound {
  readonly consumer: FenceTtlConsumer;
  readonly retryWindowMs: number;
  readonly deferralHorizonMs: number;
  readonly minimumMs: number;
}

/**
 * How long a copy of each consumer's jobs can stay away from the fence while
 * another copy commits: a retry (within the retry window, times the margin
 * for run times and redeliveries after a crash), a rate-limited wait (at most
 * the deferral horizon), deferrals of a delivery whose handler could not start
 * (not past the horizon after the job was due), and whatever the transport
 * holds beyond these. Summed, which covers each of them with room to spare.
 */
function ttlBounds(options: TtlBoundOptions): ConsumerTtlBound[] {
  const margin = options.safetyMargin ?? 2;
  if (!(margin >= 1)) throw new InvalidConfigError(`fence cleanup: safetyMargin must be at least 1, got ${margin}`);
  if (options.consumers.length === 0) {
    throw new InvalidConfigError(
      "fence cleanup: name the consumers whose fences it cleans, so their retry windows can be checked",
    );
  }
  const hold = options.transportHoldMs ?? 0;
  if (!Number.isFinite(hold) || hold < 0)
    throw new InvalidConfigError(`fence cleanup: transportHoldMs must be >= 0, got ${hold}`);
  return options.consumers.map((consumer) => {
    const retryWindowMs = maxRetryWindowMs(consumer.retryPolicy);
    const deferralHorizonMs = consumer.deferralHorizonMs ?? DEFAULT_DEFERRAL_HORIZON_MS;
    if (!(Number.isFinite(deferralHorizonMs) && deferralHorizonMs >= 0)) {
      throw new InvalidConfigError(
        `fence cleanup: consumer "${consumer.name}" has no valid deferralHorizonMs (${deferralHorizonMs}); pass the consumer from defineConsumer`,
      );
    }
    return { consumer, retryWindowMs, deferralHorizonMs, minimumMs: retryWindowMs * margin + deferralHorizonMs + hold };
  });
}

/**
 * The shortest TTL `checkFenceTtl` accepts for these consumers: for the one
 * whose copies can come back latest, its retry window times `safetyMargin`,
 * plus its deferral horizon, plus `transportHoldMs`.
 */
export function minimumFenceTtlMs(options: TtlBoundOptions): number {
  return Math.max(...ttlBounds(options).map((b) => b.minimumMs));
}

/**
 * Refuses (InvalidConfigError naming the consumer and the numbers) a TTL that
 * a late copy of a job could outlive: a late retry, a job deferred up to its
 * deferral horizon (a 429's Retry-After, a handler that could not start), or
 * a message the transport still holds. Called by createFenceCleanup; call it
 * yourself to fail before opening anything.
 */
export function checkFenceTtl(options: FenceTtlOptions): void {
  const { ttlMs } = options;
  if (!Number.isFinite(ttlMs) || ttlMs <= 0)
    throw new InvalidConfigError(`fence cleanup: ttlMs must be a positive number, got ${ttlMs}`);
  const margin = options.safetyMargin ?? 2;
  const hold = options.transportHoldMs ?? 0;
  // Named: the consumer that needs the longest TTL, so the minimum in the message is the one to configure.
  const longest = ttlBounds(options).reduce((a, b) => (b.minimumMs > a.minimumMs ? b : a));
  const { consumer, retryWindowMs: window, deferralHorizonMs: horizon, minimumMs } = longest;
  if (ttlMs < minimumMs) {
    throw new InvalidConfigError(
      `fence cleanup: TTL ${ttlMs} ms is too short for consumer "${consumer.name}": its retries can span ${window} ms ` +
        `and its deferrals (a rate limit's Retry-After, a handler that could not start) up to its deferral horizon of ${horizon} ms, ` +
        `so the TTL must be at least ${margin} × ${window} + ${horizon} (deferral horizon)${hold ? ` + ${hold} (transport hold)` : ""} = ${minimumMs} ms ` +
        "(a copy of the job delivered after its fence expired would apply the work twice)",
    );
  }
}
