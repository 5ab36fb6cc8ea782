/**
 * TTL cleanup of `core.processed_jobs`. A fence row must outlive every late
 * copy of its job, or the late copy would find no fence and run the work
 * twice: so before anything is deleted the TTL is checked against how late a
 * copy of each consumer's jobs can come back (ADR 0006) — the retry schedule
 * (with a safety margin), the consumer's deferral horizon (no rate-limited
 * wait, whatever its Retry-After, is longer; a delivery whose handler never
 * started, which never reached the fence, is not deferred past it) and the
 * transport's hold. Rows of jobs
 * that still have a pending dead letter are kept whatever their age, because
 * replaying that letter must stay a no-op for the consumers that succeeded.
 * So are rows of jobs whose letter was replayed less than a TTL ago: the
 * replay is a new publication of the job, which the transport may still hold
 * and redeliver (retries, deferrals, its own redelivery) for as long as an
 * original's copies — the window the TTL was checked to cover. Letters
 * discarded less than a TTL ago count too: a replay whose publish went out but
 * whose status change failed leaves its letter pending, and an operator may
 * discard it while that replay is still in the transport. A replay in
 * progress (its transaction has not committed yet, or a batch item whose turn
 * has not come) still shows its letter as pending.
 * Deletion goes in bounded batches, each its own short transaction that skips
 * rows another transaction holds, so live consumers inserting fences are never
 * blocked for long.
 */
import { sql } from "drizzle-orm";
import type { AnyPgDatabase, Consumer } from "../consumer.ts";
import { InvalidConfigError } from "../errors.ts";
import { rowsOf } from "../ops/operations.ts";
import { DEFAULT_DEFERRAL_HORIZON_MS, maxRetryWindowMs } from "../retry.ts";
import { MAX_TIMER_DELAY_MS } from "../timers.ts";

/** What the TTL check reads of a consumer; `deferralHorizonMs` @default DEFAULT_DEFERRAL_HORIZON_MS (as `defineConsumer`). */
export type FenceTtlConsumer = Pick<Consumer, "name" | "retryPolicy"> & Partial<Pick<Consumer, "deferralHorizonMs">>;

export interface FenceCleanupOptions {
  readonly db: AnyPgDatabase;
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
  /** Rows deleted per transaction. @default 5000 */
  readonly batchSize?: number;
  /** Rest between batches, leaving the database's CPU to live consumers. @default 10 */
  readonly pauseBetweenBatchesMs?: number;
  /**
   * How long the transport may hold a copy of a message beyond the retry
   * schedule (a deferral, the provider's own redelivery): added to the minimum
   * TTL. @default 0 (the in-process adapter); for Vercel Queues, its horizon.
   */
  readonly transportHoldMs?: number;
}

/**
 * What a run did. Every figure is a sum over the pages the run scanned (no
 * statement counts the expired rows as a whole), so
 * `scanned = deleted + keptForPendingDeadLetters + keptForReplays`; rows a
 * live transaction held (SKIP LOCKED) are in none of them and go next run.
 */
export interface CleanupReport {
  /** Rows deleted (or, in a dry run, that would be). */
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
   * Deletes expired rows until none is left (or `maxBatches`). With `dryRun`
   * it reads the same pages without locking or deleting and reports what it
   * would do: give it `maxBatches` to bound it (`complete` says whether the
   * figures cover every expired row or only the pages read).
   */
  run(options?: { dryRun?: boolean; maxBatches?: number; signal?: AbortSignal }): Promise<CleanupReport>;
}

type TtlBoundOptions = Pick<FenceCleanupOptions, "consumers" | "safetyMargin" | "transportHoldMs">;

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
export function checkFenceTtl(
  options: Pick<FenceCleanupOptions, "ttlMs" | "consumers" | "safetyMargin" | "transportHoldMs">,
): void {
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

/**
 * Validates the TTL against the consumers (throwing `InvalidConfigError`
 * naming the one it could not cover) and returns the cleanup.
 */
export function createFenceCleanup(options: FenceCleanupOptions): FenceCleanup {
  checkFenceTtl(options);
  const batchSize = options.batchSize ?? 5000;
  const pauseMs = options.pauseBetweenBatchesMs ?? 10;
  const { ttlMs, db } = options;
  if (!Number.isFinite(pauseMs) || pauseMs < 0) {
    throw new InvalidConfigError(`fence cleanup: pauseBetweenBatchesMs must be >= 0, got ${pauseMs}`);
  }
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) {
    throw new InvalidConfigError(`fence cleanup: batchSize must be an integer from 1 to 100000, got ${batchSize}`);
  }
  const names = options.consumers.map((c) => c.name);
  const seconds = ttlMs / 1000;
  // Only the fences of the consumers whose windows were checked; database
  // time decides what is expired (processed_at is written with now()).
  const expired = sql`p.consumer in ${names} and p.processed_at < now() - make_interval(secs => ${seconds})`;
  // A letter that a replay may still depend on: pending, or replayed or
  // discarded (status_changed_at is set in the transaction that publishes a
  // replay) less than a TTL ago. Each is at most an index probe
  // (dead_letters_job_consumer_idx) per row of the page.
  // Each page is classified once: deleted, or kept for a letter that depends
  // on it. The report's figures are the sums over the pages scanned, so no
  // statement ever counts the expired rows as a whole (#9 item 12).
  const classified = sql`
    select page.job_id, page.consumer,
           exists (select 1 from core.dead_letters d where d.job_id = page.job_id::text and d.status = 'pending_review') as pending,
           exists (select 1 from core.dead_letters d where d.job_id = page.job_id::text and d.status in ('replayed', 'discarded')
                     and d.status_changed_at >= now() - make_interval(secs => ${seconds})) as replay
    from page`;
  const lastOfPage = sql`(select to_char(processed_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '|' || job_id || '|' || consumer
                    from page order by processed_at desc, job_id desc, consumer desc limit 1) as last`;
  const figures = sql`(select count(*)::int from page) as scanned,
                 (select count(*) filter (where c.pending)::int from classified c) as pending,
                 (select count(*) filter (where c.replay and not c.pending)::int from classified c) as replays`;

  return {
    ttlMs,
    async run(runOptions = {}) {
      const started = performance.now();
      const dryRun = runOptions.dryRun ?? false;
      const totals = { deleted: 0, scanned: 0, pending: 0, replays: 0 };
      let batches = 0;
      let complete = false;
      // Keyset paging: each batch starts after the last row the previous one
      // reached, so rows kept for pending dead letters are read once per run.
      let after: { at: string; jobId: string; consumer: string } | undefined;
      for (;;) {
        if (runOptions.signal?.aborted) break;
        if (runOptions.maxBatches !== undefined && batches >= runOptions.maxBatches) break;
        const position = after
          ? sql`and (p.processed_at, p.job_id, p.consumer) > (${after.at}::timestamptz, ${after.jobId}::uuid, ${after.consumer})`
          : sql``;
        // Oldest first through the expiry index; SKIP LOCKED never waits on a
        // live transaction. A dry run reads the same pages without locking or deleting.
        const page = sql`
            select p.job_id, p.consumer, p.processed_at from core.processed_jobs p
            where ${expired} ${position}
            order by p.processed_at, p.job_id, p.consumer
            limit ${batchSize}`;
        const result = await db.execute(
          dryRun
            ? sql`
          with page as (${page}), classified as (${classified})
          select (select count(*)::int from classified c where not c.pending and not c.replay) as deleted,
                 ${figures}, ${lastOfPage}`
            : sql`
          with page as (${page} for update skip locked), classified as materialized (${classified}), victim as (
            delete from core.processed_jobs t using classified c
            where t.job_id = c.job_id and t.consumer = c.consumer and not c.pending and not c.replay
            returning 1
          )
          select (select count(*)::int from victim) as deleted, ${figures}, ${lastOfPage}`,
        );
        const [row] = rowsOf<{
          deleted: number;
          scanned: number;
          pending: number;
          replays: number;
          last: string | null;
        }>(result);
        batches += 1;
        totals.deleted += row?.deleted ?? 0;
        totals.scanned += row?.scanned ?? 0;
        totals.pending += row?.pending ?? 0;
        totals.replays += row?.replays ?? 0;
        if (!row?.last || (row.scanned ?? 0) < batchSize) {
          complete = true;
          break;
        }
        const [at, jobId, consumer] = row.last.split("|") as [string, string, string];
        after = { at, jobId, consumer };
        if (pauseMs > 0 && !dryRun) await new Promise((resolve) => setTimeout(resolve, pauseMs));
      }
      // Holds outlive no message they count: once the fences are done, the
      // expired holds of the same consumers go, in bounded SKIP LOCKED pages.
      let holdsDeleted = 0;
      while (complete && !dryRun && !runOptions.signal?.aborted) {
        const result = await db.execute(sql`
          with page as (
            select consumer, message_key, delivery_count from core.transport_holds
            where consumer in ${names} and held_at < now() - make_interval(secs => ${seconds})
            order by held_at limit ${batchSize} for update skip locked
          ), victim as (
            delete from core.transport_holds t using page
            where t.consumer = page.consumer and t.message_key = page.message_key and t.delivery_count = page.delivery_count
            returning 1
          )
          select count(*)::int as deleted from victim`);
        const deleted = rowsOf<{ deleted: number }>(result)[0]?.deleted ?? 0;
        holdsDeleted += deleted;
        if (deleted < batchSize) break;
      }
      return {
        deleted: totals.deleted,
        holdsDeleted,
        keptForPendingDeadLetters: totals.pending,
        keptForReplays: totals.replays,
        scanned: totals.scanned,
        batches,
        complete,
        durationMs: Math.round(performance.now() - started),
        dryRun,
      };
    },
  };
}

/**
 * Runs the cleanup every `intervalMs` until stopped; a failed run is reported
 * and the next one tries again. Runs never overlap.
 */
export function scheduleFenceCleanup(
  cleanup: FenceCleanup,
  options: { intervalMs: number; onRun?: (report: CleanupReport) => void; onError?: (error: unknown) => void },
): { stop(): Promise<void> } {
  if (!Number.isFinite(options.intervalMs) || options.intervalMs <= 0 || options.intervalMs > MAX_TIMER_DELAY_MS) {
    throw new InvalidConfigError(
      `fence cleanup schedule: intervalMs must be positive and at most ${MAX_TIMER_DELAY_MS} ms (a timer's limit), got ${options.intervalMs}`,
    );
  }
  const controller = new AbortController();
  let running: Promise<void> | undefined;
  const timer = setInterval(() => {
    if (running) return; // the previous run is still going
    running = cleanup
      .run({ signal: controller.signal })
      .then(
        (r) => options.onRun?.(r),
        (e: unknown) => options.onError?.(e),
      )
      // A throwing callback must not become an unhandled rejection.
      .catch(() => {})
      .finally(() => {
        running = undefined;
      });
  }, options.intervalMs);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      controller.abort();
      await running;
    },
  };
}
