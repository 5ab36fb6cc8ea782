/** The options, report and handle of the fence TTL cleanup (`fence-cleanup.ts`). */
import type { AnyPgDatabase } from "../db/types.ts";
import type { FencePartitionsReport } from "./fence-partitions.ts";
import type { FenceTtlOptions } from "./fence-ttl.ts";

export interface FenceCleanupOptions extends FenceTtlOptions {
  readonly db: AnyPgDatabase;
  /** Rows deleted per transaction. @default 5000 */
  readonly batchSize?: number;
  /** Rest between batches, leaving the database's CPU to live consumers. @default 10 */
  readonly pauseBetweenBatchesMs?: number;
  /**
   * Day partitions of the fence kept ready ahead of today by
   * `ensurePartitions()`, which `scheduleFenceCleanup` calls before each run
   * (ADR 0014). @default 7
   */
  readonly partitionDaysAhead?: number;
  /**
   * How long a partition's DDL waits for its lock before giving way: the
   * detach of an expired day needs the fence table to itself for a moment,
   * so it waits for the work transactions in flight while new fence inserts
   * queue behind it. Tried again with a backoff (`partitionLockRetries`),
   * then left to the next run. @default 250
   */
  readonly partitionLockTimeoutMs?: number;
  /** @default 5 */
  readonly partitionLockRetries?: number;
}

/**
 * What a run did. The DELETE batches' figures are sums over the pages the run
 * scanned (no statement counts the expired rows as a whole), so
 * `scanned = deleted + keptForPendingDeadLetters + keptForReplays`; rows a
 * live transaction held (SKIP LOCKED) are in none of them and go next run.
 * The batches read the default partition (the fences of days without a
 * partition of their own, and the ones moved out of dropped days), any
 * expired day kept for other consumers, and fences written before their day
 * began (a producer's clock ahead); whole days go with their partition
 * (`partitionsDropped`) instead.
 */
export interface CleanupReport {
  /** Rows deleted by the batches (or, in a dry run, that would be). */
  readonly deleted: number;
  /** Expired rows read, in `batches` pages of at most `batchSize`. */
  readonly scanned: number;
  /** Expired rows kept because their job has a pending dead letter. */
  readonly keptForPendingDeadLetters: number;
  /**
   * Expired rows kept because a letter of their job left review (replayed, or
   * discarded) less than a TTL ago: a replay of it may still be delivered.
   */
  readonly keptForReplays: number;
  readonly batches: number;
  /**
   * Day partitions whose whole day is past the TTL, detached and dropped
   * (ADR 0014; in a dry run, that would be). Their rows are in no other figure.
   */
  readonly partitionsDropped: number;
  /**
   * Fences of those days the cleanup keeps (written less than a TTL ago, or
   * of a job with a pending letter, or one replayed or discarded less than a
   * TTL ago), moved into the default partition in the detach's transaction;
   * later runs' batches read them like any other row there.
   */
  readonly rowsMovedToDefault: number;
  /**
   * Expired days not dropped because they hold fences of consumers this
   * cleanup was not given (whose TTL it did not check): its batches delete
   * its own consumers' expired rows there instead.
   */
  readonly partitionsKeptForOtherConsumers: number;
  /** Expired days whose detach did not get its lock within the retries (a long transaction held it): next run. */
  readonly partitionsDeferred: number;
  /**
   * Transport holds (`core.transport_holds`, #19) older than the TTL deleted
   * with a complete run: older than any message they count (the TTL covers
   * the transport's retention). 0 in a dry run.
   */
  readonly holdsDeleted: number;
  /**
   * True when the run reached the end of the expired rows; false when
   * `maxBatches` or the signal stopped it first, so the figures cover only
   * the pages read (for a dry run: a lower bound of what a full run would do).
   */
  readonly complete: boolean;
  readonly durationMs: number;
  readonly dryRun: boolean;
}

export interface FenceCleanup {
  readonly ttlMs: number;
  /**
   * Drops the day partitions past the TTL, then deletes expired rows until
   * none is left (or `maxBatches`). With `dryRun` it reads the same pages
   * without locking or deleting and reports what it would do: give it
   * `maxBatches` to bound it (`complete` says whether the figures cover every
   * expired row or only the pages read).
   */
  run(options?: { dryRun?: boolean; maxBatches?: number; signal?: AbortSignal }): Promise<CleanupReport>;
  /**
   * Creates the missing day partitions up to `partitionDaysAhead` days ahead
   * (`ensureFencePartitions`). Idempotent; safe from several processes.
   */
  ensurePartitions?(): Promise<FencePartitionsReport>;
}
