/**
 * A consumer's definition (`defineConsumer`): validated once, at module load,
 * so a bad one fails at start and not on the first job. What the harness does
 * with a delivery is `consumer.ts` (`bindConsumer`).
 */
import type { z } from "zod";
import type { HandlerContext } from "./context.ts";
import { type BatchOptions, checkBatchOptions } from "./db/batch.ts";
import { ENVELOPE_FIELD_MAX, type Envelope } from "./envelope.ts";
import { InvalidConfigError } from "./errors.ts";
import { parseLaneQueue } from "./lanes/names.ts";
import { checkLimits, type RateLimit } from "./limits/limits.ts";
import { DEFAULT_DEFERRAL_HORIZON_MS, type RetryPolicy, resolveRetryPolicy } from "./retry.ts";

/** Default bound on one handler run; below the in-process adapter's default visibility timeout (30 s). */
export const DEFAULT_HANDLER_TIMEOUT_MS = 25_000;

export interface ConsumerDefinition<TSchema extends z.ZodType> {
  /** Unique, stable name: it is the fence's `consumer` column, so renaming it re-runs every job. */
  readonly name: string;
  /** The queue this consumer reads. */
  readonly queue: string;
  /** The envelope kind(s) accepted, version included (`points.award.v1`). Any other kind is poison. */
  readonly kind: string | readonly string[];
  /** Validates `envelope.data`; data that fails it is poison (dead-lettered, never retried). */
  readonly schema: TSchema;
  /** The work. Throw to fail: `PermanentError` to dead-letter now, `RateLimitedError` to wait without spending an attempt, anything else to retry. */
  readonly handle: (data: z.output<TSchema>, ctx: HandlerContext) => Promise<void>;
  /** Overrides of the platform retry policy; needs a justification in the module's spec. @default DEFAULT_RETRY_POLICY */
  readonly retry?: Partial<RetryPolicy>;
  /**
   * Business validity: a job delivered more than this after it was due (the
   * transport's `Delivery.dueAt`: publish time plus delay; else its job_id's
   * timestamp) is dead-lettered as `expired`. Replays are never expired. @default no limit
   */
  readonly maxAgeMs?: number;
  /**
   * Jobs with the same key run one at a time (a transaction-scoped advisory
   * lock taken before the fence), live and replayed alike. @default none
   */
  readonly orderingKey?: (data: z.output<TSchema>, envelope: Envelope) => string;
  /**
   * Bound on one run, in ms: one budget for the work transaction, from asking
   * for a connection to COMMIT's answer (a wait for the connection or the
   * ordering lock leaves the handler less of it). On timeout the handler's
   * `signal` fires, the transaction is rolled back, its connection destroyed,
   * and the job is retried as a transient failure. The whole delivery,
   * `deliveryBoundMs` (2 × timeoutMs + 5 s: the run, ROLLBACK, and one
   * timeoutMs shared by all the rest — async schema checks, rate gate and lane
   * before the run, the dead-letter decision, a provider's wait and the lane
   * after it), must be shorter than the transport's visibility timeout /
   * lease, so a delivery is never still going when the message comes back
   * (adapters check this when the consumer is subscribed).
   * @default DEFAULT_HANDLER_TIMEOUT_MS (25 s)
   */
  readonly timeoutMs?: number;
  /**
   * Bounds the waits that spend no attempt, so that no copy of a job can come
   * back after the fence cleanup's TTL (`checkFenceTtl` adds it to the
   * minimum TTL; ADR 0006). A rate-limited wait is never longer than this,
   * whatever the provider's Retry-After (the job comes back sooner and may be
   * told to wait again). A delivery whose handler never started (it never
   * reached the fence) is not deferred past this long after the job became due
   * (`Delivery.dueAt`, else its job_id's timestamp): it is dead-lettered
   * (`exhausted`) instead, or acknowledged as a duplicate if a copy already
   * committed. @default DEFAULT_DEFERRAL_HORIZON_MS (12 h)
   */
  readonly deferralHorizonMs?: number;
  /**
   * Rate limits (`provider(name, { rate, per })`, `perTenant({ rate, per })`):
   * a token from each is taken before the work transaction opens; without
   * one the delivery waits (`rate_limited`, no attempt spent, never a dead
   * letter), and a provider's 429 from the handler makes that provider's
   * bucket wait in every process. Needs `HarnessDeps.rateLimiter`. @default none
   */
  readonly limits?: readonly RateLimit[];
  /**
   * For a consumer of a marketing lane (`notif.{channel}.marketing`): it
   * yields — defers, spending no attempt — while its channel's transactional
   * backlog holds more than this many jobs. Needs `HarnessDeps.laneBacklog`
   * (every consumer of a lane queue does). @default 0
   */
  readonly yieldAbove?: number;
  /**
   * Run deliveries that arrive together in one work transaction: up to
   * `maxSize` jobs, gathered for up to `maxWaitMs` — one multi-row fence
   * insert, a savepoint per job, one COMMIT (`db/batch.ts`). Every rule holds
   * per job: a handler that throws is undone alone and classified as usual,
   * duplicates and pending letters are found per job, a batch never holds two
   * jobs of one ordering key. The batch shares one budget of `timeoutMs`, so
   * batch consumers whose handlers are short (a few queries); a handler may
   * not end the transaction itself (COMMIT through `tx` is refused).
   * `concurrent: true` runs the batch's handlers at once, pipelined, with no
   * savepoints (README "Concurrent handlers"): for handlers that write in
   * single statements.
   * A delivery's bound (`deliveryBoundMs`) grows by `maxWaitMs`.
   * @default none: one transaction per job
   */
  readonly batch?: BatchOptions;
}

export interface Consumer<TSchema extends z.ZodType = z.ZodType> extends ConsumerDefinition<TSchema> {
  readonly kinds: ReadonlySet<string>;
  readonly retryPolicy: RetryPolicy;
  readonly timeoutMs: number;
  readonly deferralHorizonMs: number;
}

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/;

/** Validates a consumer definition once, at module load, so a bad one fails at start and not on the first job. */
export function defineConsumer<TSchema extends z.ZodType>(definition: ConsumerDefinition<TSchema>): Consumer<TSchema> {
  const owner = `consumer ${JSON.stringify(definition?.name)}`;
  if (typeof definition?.name !== "string" || !NAME_PATTERN.test(definition.name)) {
    throw new InvalidConfigError(
      `${owner}: name must be 1-200 letters, digits or . _ : - (it is stored in every fence row)`,
    );
  }
  if (typeof definition.queue !== "string" || !NAME_PATTERN.test(definition.queue)) {
    throw new InvalidConfigError(
      `${owner}: queue must be 1-200 letters, digits or . _ : -, got ${JSON.stringify(definition.queue)}`,
    );
  }
  const kindList = typeof definition.kind === "string" ? [definition.kind] : [...(definition.kind ?? [])];
  if (
    kindList.length === 0 ||
    kindList.some((k) => typeof k !== "string" || k.length === 0 || k.length > ENVELOPE_FIELD_MAX)
  ) {
    throw new InvalidConfigError(`${owner}: kind must be a non-empty string or a non-empty list of them`);
  }
  if (typeof definition.schema?.safeParse !== "function") {
    throw new InvalidConfigError(`${owner}: schema must be a Zod schema for the job's data`);
  }
  if (typeof definition.handle !== "function") {
    throw new InvalidConfigError(`${owner}: handle must be a function`);
  }
  if (definition.maxAgeMs !== undefined && !(Number.isFinite(definition.maxAgeMs) && definition.maxAgeMs > 0)) {
    throw new InvalidConfigError(`${owner}: maxAgeMs must be a positive number of milliseconds`);
  }
  const timeoutMs = definition.timeoutMs ?? DEFAULT_HANDLER_TIMEOUT_MS;
  if (!(Number.isFinite(timeoutMs) && timeoutMs >= 1 && timeoutMs <= 12 * 3_600_000)) {
    throw new InvalidConfigError(`${owner}: timeoutMs must be a number of milliseconds from 1 to 43200000 (12 h)`);
  }
  const deferralHorizonMs = definition.deferralHorizonMs ?? DEFAULT_DEFERRAL_HORIZON_MS;
  if (!(Number.isFinite(deferralHorizonMs) && deferralHorizonMs >= 1_000 && deferralHorizonMs <= 30 * 86_400_000)) {
    throw new InvalidConfigError(
      `${owner}: deferralHorizonMs must be a number of milliseconds from 1000 to 2592000000 (30 days)`,
    );
  }
  const limits = checkLimits(definition.limits, owner);
  const batch = checkBatchOptions(definition.batch, owner);
  if (definition.yieldAbove !== undefined) {
    if (parseLaneQueue(definition.queue)?.lane !== "marketing") {
      throw new InvalidConfigError(
        `${owner}: yieldAbove is for consumers of a marketing lane (notif.{channel}.marketing), and queue is ${JSON.stringify(definition.queue)}`,
      );
    }
    if (!(Number.isInteger(definition.yieldAbove) && definition.yieldAbove >= 0)) {
      throw new InvalidConfigError(`${owner}: yieldAbove must be a whole number of jobs, 0 or more`);
    }
  }
  return Object.freeze({
    ...definition,
    ...(limits.length > 0 ? { limits } : {}),
    ...(batch === undefined ? {} : { batch }),
    timeoutMs,
    deferralHorizonMs,
    kinds: new Set(kindList),
    retryPolicy: resolveRetryPolicy(definition.retry, owner),
  });
}
