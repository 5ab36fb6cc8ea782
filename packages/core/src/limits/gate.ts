/**
 * What the harness does with a consumer's limits (#20): before the work
 * transaction opens — no connection, no lock, no fence — a delivery takes a
 * token from each of its buckets, or is deferred to when the refusing bucket
 * has one again (jittered, the window growing with the job's deferrals so
 * waiting jobs do not all come back at once). A limiter that cannot answer
 * in time defers the delivery too: never a pass-through, never an attempt.
 * A provider's 429 from the handler blocks that provider's bucket for every
 * process at once.
 */
import { describeError } from "../errors.ts";
import { withinMs } from "../timers.ts";
import { bucketsOf, type RateLimit } from "./limits.ts";
import type { RateLimiter } from "./port.ts";

/** The jitter window stops growing after this many deferrals (× 64 the bucket's interval). */
const JITTER_DOUBLINGS = 6;

export type Admission =
  | { readonly ok: true }
  | { readonly ok: false; readonly limited: true; readonly retryAfterMs: number; readonly error: string }
  | { readonly ok: false; readonly limited: false; readonly error: string };

export class RateGate {
  readonly #consumer: string;
  readonly #limits: readonly RateLimit[];
  readonly #limiter: RateLimiter;
  readonly #timeoutMs: number;
  readonly #random: () => number;

  constructor(
    consumer: string,
    limits: readonly RateLimit[],
    limiter: RateLimiter,
    timeoutMs: number,
    random: () => number,
  ) {
    this.#consumer = consumer;
    this.#limits = limits;
    this.#limiter = limiter;
    this.#timeoutMs = timeoutMs;
    this.#random = random;
  }

  /** A token from every bucket of this delivery, or why it must wait. */
  async admit(tenantId: string, deferrals: number, ms = this.#timeoutMs): Promise<Admission> {
    const buckets = bucketsOf(this.#limits, this.#consumer, tenantId);
    let taken: Awaited<ReturnType<RateLimiter["take"]>>;
    try {
      taken = await withinMs(
        this.#limiter.take(buckets),
        ms,
        () => new Error(`the rate limiter did not answer within ${ms} ms`),
      );
    } catch (error) {
      return { ok: false, limited: false, error: `rate limiter unavailable: ${describeError(error)}` };
    }
    if (taken.ok) return { ok: true };
    const bucket = buckets.find((b) => b.key === taken.bucket);
    const interval = bucket ? bucket.perMs / bucket.rate : 1_000;
    const spread = interval * 2 ** Math.min(Math.max(0, deferrals), JITTER_DOUBLINGS);
    return {
      ok: false,
      limited: true,
      retryAfterMs: Math.max(1, Math.ceil(taken.retryAfterMs + this.#random() * spread)),
      error: `rate limit ${taken.bucket}: no token for ${taken.retryAfterMs} ms`,
    };
  }

  /** A provider answered 429: its buckets wait `forMs`, in every process; the limiter gets `ms` to hear it. Never throws. */
  async providerSaidWait(forMs: number, ms = this.#timeoutMs): Promise<void> {
    const providers = this.#limits.filter((l) => l.scope === "provider");
    if (providers.length === 0) return;
    await Promise.allSettled(
      bucketsOf(providers, this.#consumer, "").map((bucket) =>
        withinMs(this.#limiter.block(bucket, forMs), ms, () => new Error("block timed out")),
      ),
    );
  }
}
