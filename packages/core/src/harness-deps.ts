/**
 * What a bound consumer is given at run time (`HarnessDeps`), and the bounds
 * the harness derives from a consumer's `timeoutMs`: the whole delivery
 * (`deliveryBoundMs`) that transports check against their visibility timeout,
 * and the fence-TTL margin (`fenceTtlMarginMs`).
 */

import type { AnyPgDatabase } from "./db/types.ts";
import { runBoundMs } from "./db/work-transaction.ts";
import type { Consumer } from "./definition.ts";
import type { LaneBacklog } from "./lanes/backlog.ts";
import type { RateLimiter } from "./limits/port.ts";
import type { AlertPort } from "./ports/alerts.ts";
import type { Logger } from "./ports/logger.ts";
import type { MetricsPort } from "./ports/metrics.ts";

/** What a consumer needs at run time; the module's composition root supplies it. */
export interface HarnessDeps {
  /** Drizzle database (postgres.js in production, PGlite for the embedded demo). */
  readonly db: AnyPgDatabase;
  /**
   * Where a consumer's `limits` take their tokens: `upstashRateLimiter`
   * (`@softcrum/core/limits/upstash`) across processes, `inProcessRateLimiter`
   * in one. Required when the consumer declares limits. @default none
   */
  readonly rateLimiter?: RateLimiter;
  /**
   * The transactional backlog of the notification lanes (ADR 0011):
   * `upstashLaneBacklog` (`@softcrum/core/lanes/upstash`) across processes,
   * `inProcessLaneBacklog` in one. Required for a consumer of a lane queue
   * (`notif.{channel}.transactional|marketing`): a marketing one yields to
   * it, a transactional one takes its jobs out of it. Publishers count their
   * transactional jobs into the same backlog with `countTransactional`. @default none
   */
  readonly laneBacklog?: LaneBacklog;
  /** @default no alerts */
  readonly alerts?: AlertPort;
  /** @default no metrics */
  readonly metrics?: MetricsPort;
  /** @default console */
  readonly logger?: Logger;
  /** Source of jitter, in [0, 1). @default Math.random */
  readonly random?: () => number;
  /** Current time in ms since the epoch, for `maxAgeMs`. @default Date.now */
  readonly now?: () => number;
  /**
   * Pipeline BEGIN, lock and fence (postgres.js only). Turn off behind a
   * pooler that wedges on pipelined queries (Supavisor in transaction mode).
   * @default true
   */
  readonly pipeline?: boolean;
  /** Longest `flushAlerts()` waits for the alert sink before it gives up (counted as a failed alert). @default 5000 */
  readonly alertFlushTimeoutMs?: number;
  /**
   * The fence TTL, exactly as the fence cleanup is given it (`ttlMs`): the
   * harness obeys the same law. A copy of a job delivered later than
   * `fenceTtlMs` minus the consumer's `fenceTtlMarginMs` after the job was
   * due (`Delivery.dueAt`, else its job_id's time; for an operator's replay,
   * when it was replayed, while the cleanup keeps that letter's fences) is
   * not run: its fence, or the fence of a copy that committed, could be
   * cleaned up before it finished. It is dead-lettered `expired` with that
   * evidence (a duplicate when a copy committed). Then no combination of
   * retries, deferrals, lock waits or transport holds can outlive a fence.
   * @default none (only the cleanup's start-time check guards the TTL)
   */
  readonly fenceTtlMs?: number;
  /**
   * The outbox relay to wake after a job that wrote to `ctx.outbox` commits,
   * so its jobs go out at once rather than at the relay's next poll. Jobs
   * that wrote nothing to the outbox never touch it. @default none (the relay polls)
   */
  readonly outboxRelay?: { wake(): void };
}

/**
 * The longest one delivery of this consumer can take, the real sum: the wait
 * for its batch to form (a batched consumer's `batch.maxWaitMs`), its work
 * transaction (one budget of `timeoutMs`, from asking for a connection to
 * COMMIT's answer), ROLLBACK's allowance after a failure, then one more
 * `timeoutMs` for everything outside the run, shared (`OutsideBudget` in
 * consumer.ts): a schema's asynchronous checks (at most half of it), the
 * lane's and the rate gate's answers before the run; the dead-letter decision
 * (its connection included), a provider's wait and the lane's settling after
 * it. A transport
 * refuses a consumer whose bound is not below its visibility timeout or lease
 * (`checkDeliveryBound`): a delivery is never still going when its message is
 * delivered again.
 */
export function deliveryBoundMs(consumer: Pick<Consumer, "timeoutMs"> & Partial<Pick<Consumer, "batch">>): number {
  return (consumer.batch?.maxWaitMs ?? 0) + runBoundMs(consumer.timeoutMs) + consumer.timeoutMs;
}

/**
 * How long before the fence TTL a copy must start, so that it finishes — the
 * whole delivery (`deliveryBoundMs`) — while the fence it checks still
 * exists; plus an allowance for clocks: the worker's clock measures a copy's
 * age, the database's stamps and expires fences.
 */
export function fenceTtlMarginMs(consumer: Pick<Consumer, "timeoutMs"> & Partial<Pick<Consumer, "batch">>): number {
  return deliveryBoundMs(consumer) + FENCE_TTL_CLOCK_ALLOWANCE_MS;
}
/** What fenceTtlMarginMs allows for the difference between the workers' clocks and the database's. */
export const FENCE_TTL_CLOCK_ALLOWANCE_MS = 300_000;
