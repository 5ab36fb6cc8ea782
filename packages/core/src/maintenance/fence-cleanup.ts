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
 * The fence is partitioned by day of the job_id's UUID v7 time (ADR 0014):
 * a day whose whole day is past the TTL goes with its partition
 * (`fence-partitions.ts`), the fences kept above moved into the default
 * partition in the detach's own transaction; the batches clean the default
 * partition (days without a partition of their own, and the moved fences).
 */
import { type SQL, sql } from "drizzle-orm";
import { InvalidConfigError } from "../errors.ts";
import { rowsOf } from "../ops/ops-helpers.ts";
import type { FenceCleanup, FenceCleanupOptions } from "./fence-cleanup-types.ts";
import {
  attachedFenceDays,
  dayRange,
  daysWithEarlyFences,
  dropExpiredFencePartitions,
  earlyInDay,
  ensureFencePartitions,
  fenceIsPartitioned,
  horizonUpsert,
} from "./fence-partitions.ts";
import { checkFenceTtl } from "./fence-ttl.ts";

export type { CleanupReport, FenceCleanup, FenceCleanupOptions } from "./fence-cleanup-types.ts";
export { scheduleFenceCleanup } from "./fence-schedule.ts";
export { checkFenceTtl, type FenceTtlConsumer, minimumFenceTtlMs } from "./fence-ttl.ts";

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
  const partitionLockTimeoutMs = options.partitionLockTimeoutMs ?? 250;
  const partitionLockRetries = options.partitionLockRetries ?? 5;
  const daysAhead = options.partitionDaysAhead ?? 7;
  for (const [name, value] of [
    ["partitionLockTimeoutMs", partitionLockTimeoutMs],
    ["partitionLockRetries", partitionLockRetries],
    ["partitionDaysAhead", daysAhead],
  ] as const) {
    const least = name === "partitionLockRetries" ? 0 : 1;
    if (!Number.isSafeInteger(value) || value < least) {
      throw new InvalidConfigError(`fence cleanup: ${name} must be a whole number >= ${least}, got ${value}`);
    }
  }
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
    ensurePartitions: () => ensureFencePartitions({ db, daysAhead, lockTimeoutMs: partitionLockTimeoutMs }),
    async run(runOptions = {}) {
      const started = performance.now();
      const dryRun = runOptions.dryRun ?? false;
      const totals = { deleted: 0, scanned: 0, pending: 0, replays: 0 };
      let batches = 0;
      let complete: boolean;
      // Whole days first: what they drop, no batch has to delete.
      const partitioned = await fenceIsPartitioned(db);
      const partitions = partitioned
        ? await dropExpiredFencePartitions({
            db,
            ttlMs,
            consumers: names,
            dryRun,
            lockTimeoutMs: partitionLockTimeoutMs,
            lockRetries: partitionLockRetries,
            signal: runOptions.signal,
          })
        : { dropped: 0, droppedDays: [], moved: 0, keptForOtherConsumers: [], deferred: 0 };
      // Then batches over the default partition (the table itself before
      // migration 0026), the expired days kept for other consumers, and the
      // fences of a day written before it began: one stream of pages, each
      // part read through its expiry index.
      const days = partitioned ? await attachedFenceDays(db) : [];
      const whole = new Set([...partitions.droppedDays, ...partitions.keptForOtherConsumers]);
      const early = await daysWithEarlyFences(
        db,
        days.filter((day) => !whole.has(day)),
        expired,
      );
      // The parts read through the fence table come first, the default
      // partition last: a statement locks its tables in the order it names
      // them, and a detach (another run's) locks the fence table, then the
      // default partition. A batch that named the default partition first
      // held it while it waited for the fence table behind that detach,
      // which waited for the default partition: a deadlock, where lock
      // waits outlast the deadlock check.
      const parts: { table: SQL; where: (alias: string) => SQL }[] = [
        ...partitions.keptForOtherConsumers.map((day) => ({
          table: sql.raw("core.processed_jobs"),
          where: (alias: string) => dayRange(day, alias),
        })),
        ...early.map((day) => ({
          table: sql.raw("core.processed_jobs"),
          where: (alias: string) => earlyInDay(day, alias),
        })),
        { table: sql.raw(partitioned ? "core.processed_jobs_default" : "core.processed_jobs"), where: () => sql`true` },
      ];
      // Keyset paging: each batch starts after the last row the previous one
      // reached, so rows kept for pending dead letters are read once per run.
      let after: { at: string; jobId: string; consumer: string } | undefined;
      complete = false;
      for (;;) {
        if (runOptions.signal?.aborted) break;
        if (runOptions.maxBatches !== undefined && batches >= runOptions.maxBatches) break;
        const position = after
          ? sql`and (p.processed_at, p.job_id, p.consumer) > (${after.at}::timestamptz, ${after.jobId}::uuid, ${after.consumer})`
          : sql``;
        // Oldest first through the expiry index; SKIP LOCKED never waits on a
        // live transaction. A dry run reads the same pages without locking or deleting.
        const lock = dryRun ? sql`` : sql`for update skip locked`;
        // One CTE per part (a row lock is not allowed inside a UNION), then the
        // page: the oldest `batchSize` of them.
        const partPages = parts.map(
          (part, i) => sql`part${sql.raw(String(i))} as (
            select p.job_id, p.consumer, p.processed_at from ${part.table} p
            where ${expired} and ${part.where("p")} ${position}
            order by p.processed_at, p.job_id, p.consumer
            limit ${batchSize} ${lock})`,
        );
        const page =
          parts.length === 1
            ? sql`select * from part0`
            : sql`select * from (${sql.join(
                parts.map((_, i) => sql`select * from part${sql.raw(String(i))}`),
                sql` union all `,
              )}) u order by processed_at, job_id, consumer limit ${batchSize}`;
        // Each part's rows are deleted from its own table (a partition's through
        // the parent with its range, so only that partition is read).
        const victims = parts.map(
          (part, i) => sql`victim${sql.raw(String(i))} as (
            delete from ${part.table} t using classified c
            where t.job_id = c.job_id and t.consumer = c.consumer and ${part.where("t")} and not c.pending and not c.replay
            returning 1
          )`,
        );
        const deletedSum = sql.join(
          parts.map((_, i) => sql`(select count(*)::int from victim${sql.raw(String(i))})`),
          sql` + `,
        );
        const ctes = sql.join(partPages, sql`, `);
        const result = await db.execute(
          dryRun
            ? sql`
          with ${ctes}, page as (${page}), classified as (${classified})
          select (select count(*)::int from classified c where not c.pending and not c.replay) as deleted,
                 ${figures}, ${lastOfPage}`
            : sql`
          with ${ctes}, page as (${page}), classified as materialized (${classified}), ${sql.join(victims, sql`, `)},
            horizon as (${horizonUpsert(names, seconds)})
          select ${deletedSum} as deleted, ${figures}, ${lastOfPage}`,
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
      if (runOptions.signal?.aborted) complete = false;
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
        partitionsDropped: partitions.dropped,
        rowsMovedToDefault: partitions.moved,
        partitionsKeptForOtherConsumers: partitions.keptForOtherConsumers.length,
        partitionsDeferred: partitions.deferred,
        complete,
        durationMs: Math.round(performance.now() - started),
        dryRun,
      };
    },
  };
}
