/**
 * Day partitions of `core.processed_jobs` (migration 0026, ADR 0014): one per
 * UTC day of the job_id's UUID v7 time, plus `processed_jobs_default`.
 * - `ensureFencePartitions` creates them ahead of time (SPEC's partition
 *   pre-creation): idempotent, and safe from any number of processes at once
 *   (the database serialises them on an advisory lock, and each step re-reads
 *   the catalog). Never a day that could already have fences in the default
 *   partition: from the first midnight at least an hour ahead, and never a
 *   day the default partition holds a fence of.
 * - `dropExpiredFencePartitions` (run by the TTL cleanup before its DELETE
 *   batches) detaches each partition whose whole day is past the TTL, moves
 *   the fences the cleanup would keep into the default partition in the same
 *   transaction (the fence table is held for milliseconds, whatever the
 *   day's size), then drops the detached table, which nothing live uses.
 * The DDL runs inside SECURITY DEFINER functions of the migration, so the
 * worker role, which owns no table, runs the schedule.
 */
import { type SQL, sql } from "drizzle-orm";
import type { AnyPgDatabase } from "../db/types.ts";
import { InvalidConfigError } from "../errors.ts";
import { rowsOf } from "../ops/ops-helpers.ts";

/** SQLSTATE 55P03, lock_not_available: what `lock_timeout` raises. */
const LOCK_NOT_AVAILABLE = "55P03";
/** Prepare → validate → attach rounds one call may take (each creates a run of consecutive days). */
const MAX_ROUNDS = 16;
const DAY = /^\d{4}-\d{2}-\d{2}$/;

export interface EnsureFencePartitionsOptions {
  readonly db: AnyPgDatabase;
  /** Partitions exist for every day up to today + `daysAhead` (UTC, the database's clock). @default 7 */
  readonly daysAhead?: number;
  /**
   * The days to create instead (inclusive, `YYYY-MM-DD`), past ones included:
   * only for a database that takes no fence of those days meanwhile (a test,
   * a benchmark, a backfill before traffic). Days whose fences already are in
   * the default partition are skipped either way.
   */
  readonly days?: { readonly first: string; readonly last: string };
  /** How long a step waits for a table lock before giving way (ACCESS EXCLUSIVE on the default partition, a moment). @default 500 */
  readonly lockTimeoutMs?: number;
  /** How many times a step whose lock wait timed out is tried again, with a growing backoff. @default 10 */
  readonly lockRetries?: number;
  /** How long the validating scan waits for its lock (SHARE UPDATE EXCLUSIVE: writes go on meanwhile). @default 30000 */
  readonly validateWaitMs?: number;
}

export interface FencePartitionsReport {
  /** Day partitions this call created (0 when another process had created them, or none was due). */
  readonly created: number;
  /** False when it stopped after its rounds with days still to create (fences of those days arrived meanwhile). */
  readonly complete: boolean;
  readonly durationMs: number;
}

/** True when `error` (or what it wraps) is a lock wait that `lock_timeout` ended. */
export function isLockTimeout(error: unknown): boolean {
  let cause: unknown = error;
  for (let depth = 0; depth < 4 && cause; depth += 1) {
    if ((cause as { code?: unknown }).code === LOCK_NOT_AVAILABLE) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

/** Most days one `days` range may name: the migration's own limit (0026, `fence_partitions_prepare`). */
const MAX_DAYS_RANGE = 400;

/**
 * `days` as the database takes them, or a clear error before anything is
 * sent: each a calendar day (`2024-02-30` is none), none before 1970 (a UUID
 * v7 holds no earlier time, so no fence has such a day), `first` not after
 * `last`, at most MAX_DAYS_RANGE days apart.
 */
function checkedDays(days: EnsureFencePartitionsOptions["days"]): { first: string | null; last: string | null } {
  const { first = null, last = null } = days ?? {};
  const at: number[] = [];
  for (const day of [first, last]) {
    if (day === null) continue;
    if (typeof day !== "string" || !DAY.test(day)) {
      throw new InvalidConfigError(`fence partitions: days are YYYY-MM-DD, got ${JSON.stringify(day)}`);
    }
    const ms = Date.parse(`${day}T00:00:00Z`);
    if (!Number.isFinite(ms) || new Date(ms).toISOString().slice(0, 10) !== day) {
      throw new InvalidConfigError(`fence partitions: ${day} is not a calendar day`);
    }
    if (ms < 0) {
      throw new InvalidConfigError(
        `fence partitions: ${day} is before 1970: a UUID v7 job id holds no earlier time, so no fence has that day`,
      );
    }
    at.push(ms);
  }
  if (first !== null && last !== null) {
    const [from = 0, to = 0] = at;
    if (from > to) throw new InvalidConfigError(`fence partitions: the first day ${first} is after the last, ${last}`);
    const span = Math.round((to - from) / 86_400_000);
    if (span > MAX_DAYS_RANGE) {
      throw new InvalidConfigError(
        `fence partitions: ${first} to ${last} is ${span} days apart, more than ${MAX_DAYS_RANGE} (create them in parts)`,
      );
    }
  }
  return { first, last };
}

function wholeMs(value: number, name: string, min: number): number {
  if (!(Number.isSafeInteger(value) && value >= min)) {
    throw new InvalidConfigError(`fence partitions: ${name} must be a whole number >= ${min}, got ${value}`);
  }
  return value;
}

/** Runs `step`; a lock wait that timed out is tried again after a jittered backoff, `retries` times. */
async function withLockRetries<T>(retries: number, step: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await step();
    } catch (error) {
      if (!isLockTimeout(error) || attempt >= retries) throw error;
      const backoff = Math.min(5_000, 100 * 2 ** attempt);
      await new Promise((resolve) => setTimeout(resolve, backoff / 2 + Math.random() * (backoff / 2)));
    }
  }
}

async function value<T>(db: AnyPgDatabase, query: SQL): Promise<T> {
  return rowsOf<{ v: T }>(await db.execute(query))[0]?.v as T;
}

/**
 * Creates the missing day partitions up to today + `daysAhead` (or `days`),
 * up to 25 days a round: a CHECK on the default partition excluding those
 * days, added NOT VALID; validated in a statement of its own (a scan that
 * blocks no write); then the partitions created and attached, and the CHECK
 * dropped, in one short transaction that scans nothing.
 */
export async function ensureFencePartitions(options: EnsureFencePartitionsOptions): Promise<FencePartitionsReport> {
  const started = performance.now();
  const { db } = options;
  const daysAhead = wholeMs(options.daysAhead ?? 7, "daysAhead", 1);
  if (daysAhead > 366)
    throw new InvalidConfigError(`fence partitions: daysAhead must be at most 366, got ${daysAhead}`);
  const lockTimeoutMs = wholeMs(options.lockTimeoutMs ?? 500, "lockTimeoutMs", 1);
  const retries = wholeMs(options.lockRetries ?? 10, "lockRetries", 0);
  const validateWaitMs = wholeMs(options.validateWaitMs ?? 30_000, "validateWaitMs", 1);
  const { first, last } = checkedDays(options.days);
  let created = 0;
  let complete = false;
  for (let round = 0; round < MAX_ROUNDS; round += 1) {
    const name = await withLockRetries(retries, () =>
      value<string | null>(
        db,
        sql`select core.fence_partitions_prepare(${daysAhead}::int, ${first}::date, ${last}::date, ${lockTimeoutMs}::int) as v`,
      ),
    );
    if (name === null || name === undefined) {
      complete = true;
      break;
    }
    const validated = await withLockRetries(retries, () =>
      value<string>(db, sql`select core.fence_partitions_validate(${validateWaitMs}::int, ${lockTimeoutMs}::int) as v`),
    );
    // A fence of those days reached the default partition meanwhile: the next
    // round's probe sees it and leaves that day out.
    if (validated === "violated") continue;
    const attached = await withLockRetries(retries, () =>
      value<number>(db, sql`select core.fence_partitions_attach(${lockTimeoutMs}::int) as v`),
    );
    if (attached > 0) created += attached;
  }
  return { created, complete, durationMs: Math.round(performance.now() - started) };
}

export interface DropExpiredPartitionsOptions {
  readonly db: AnyPgDatabase;
  readonly ttlMs: number;
  /** The consumers whose TTL was checked: a partition holding another consumer's fence is not dropped. */
  readonly consumers: readonly string[];
  readonly dryRun: boolean;
  readonly lockTimeoutMs: number;
  readonly lockRetries: number;
  readonly signal?: AbortSignal | undefined;
}

export interface DroppedPartitionsReport {
  /** Day partitions dropped (in a dry run: that would be). */
  readonly dropped: number;
  /** Their days (YYYY-MM-DD). */
  readonly droppedDays: readonly string[];
  /** Fences moved into the default partition in the detach's transaction (dry run: that would be). */
  readonly moved: number;
  /** Days past the TTL kept because they hold fences of other consumers: the DELETE batches clean them. */
  readonly keptForOtherConsumers: readonly string[];
  /** Days whose detach did not get its lock within the retries: the next run tries again. */
  readonly deferred: number;
}

/**
 * Raises the consumers' fence horizon (`core.fence_horizons`) to the cutoff
 * of a cleanup with this TTL, `now() - ttl`: sent in the statement or the
 * transaction that deletes with that cutoff, so it commits with the deletion.
 * In a fixed order, so two cleanups never wait on each other's rows in a cycle.
 */
export function horizonUpsert(consumers: readonly string[], seconds: number): SQL {
  const sorted = [...new Set(consumers)].sort();
  return sql`insert into core.fence_horizons (consumer, cleaned_before)
    select c, now() - make_interval(secs => ${seconds}) from unnest(${sql.param(sorted)}::text[]) as c order by c
    on conflict (consumer) do update set cleaned_before = greatest(core.fence_horizons.cleaned_before, excluded.cleaned_before)`;
}

/** The range of one day partition, for a query on the parent that only that partition answers. */
export function dayRange(day: string, alias: string): SQL {
  const column = sql.raw(`${alias}.job_id`);
  return sql`${column} >= core.fence_day_bound(${day}::date) and ${column} < core.fence_day_bound(${day}::date + 1)`;
}

/** The days (YYYY-MM-DD) that have a partition of the fence, oldest first. */
export async function attachedFenceDays(db: AnyPgDatabase): Promise<string[]> {
  return rowsOf<{ day: string }>(
    await db.execute(sql`
      select to_char(to_date(substr(c.relname, 17), 'YYYYMMDD'), 'YYYY-MM-DD') as day
      from pg_inherits i join pg_class c on c.oid = i.inhrelid
      where i.inhparent = 'core.processed_jobs'::regclass and c.relname ~ '^processed_jobs_p[0-9]{8}$'
      order by 1`),
  ).map((r) => r.day);
}

/**
 * Fences of a day partition written before that day began (a producer whose
 * clock ran ahead, a job id that is not a UUID v7): they expire before the
 * day can go, so the batches read them too. `where` is the batches' own
 * condition on `p`.
 */
export const earlyInDay = (day: string, alias: string): SQL =>
  sql`${dayRange(day, alias)} and ${sql.raw(`${alias}.processed_at`)} < ${day}::date::timestamp at time zone 'UTC'`;

/** Of `days`, those whose partition holds an early fence meeting `where` (one index probe each). */
export async function daysWithEarlyFences(db: AnyPgDatabase, days: readonly string[], where: SQL): Promise<string[]> {
  if (days.length === 0) return [];
  const probes = days.map(
    (day) =>
      sql`select ${day}::text as day where exists (select 1 from core.processed_jobs p where ${earlyInDay(day, "p")} and ${where})`,
  );
  return rowsOf<{ day: string }>(await db.execute(sql.join(probes, sql` union all `))).map((r) => r.day);
}

/** Whether `core.processed_jobs` is partitioned here (migration 0026 applied). */
export async function fenceIsPartitioned(db: AnyPgDatabase): Promise<boolean> {
  return (await value<boolean>(db, sql`select to_regclass('core.processed_jobs_default') is not null as v`)) === true;
}

/**
 * Detaches and drops every day partition whose day ended more than `ttlMs`
 * ago (database time), after moving what the TTL cleanup keeps into the
 * default partition in the detach's own transaction. A partition is left
 * (and its rows left to the DELETE batches) when it holds a fence of a
 * consumer whose TTL was not checked: found by a read of the partition before
 * the detach, which takes no lock that stops a write. A partition an earlier
 * run detached but could not drop is dropped.
 */
export async function dropExpiredFencePartitions(
  options: DropExpiredPartitionsOptions,
): Promise<DroppedPartitionsReport> {
  const { db, dryRun } = options;
  const seconds = options.ttlMs / 1000;
  const names = options.consumers;
  const days = rowsOf<{ day: string; attached: boolean }>(
    await db.execute(sql`
      select to_char(x.day, 'YYYY-MM-DD') as day, x.attached from (
        select to_date(substr(c.relname, 17), 'YYYYMMDD') as day,
               exists (select 1 from pg_inherits i
                       where i.inhrelid = c.oid and i.inhparent = 'core.processed_jobs'::regclass) as attached
        from pg_class c
        where c.relnamespace = 'core'::regnamespace and c.relkind = 'r' and c.relname ~ '^processed_jobs_p[0-9]{8}$'
      ) x
      where (x.day + 1)::timestamp at time zone 'UTC' <= now() - make_interval(secs => ${seconds})
      order by x.day`),
  );
  const droppedDays: string[] = [];
  let moved = 0;
  let deferred = 0;
  const kept: string[] = [];
  // A day's detach and drop run one at a time across processes (two
  // cleanups at once: two modules, two replicas of a worker): each waits on
  // the day's advisory lock, in its own transaction, for at most the lock
  // timeout, then reads the catalog again; the second finds the day gone
  // (was: its DETACH or DROP, queued behind the first, failed on a table
  // that was no longer a partition, or no longer there, and so did its run).
  const onDay = <T>(day: string, step: (tx: AnyPgDatabase) => Promise<T>) =>
    db.transaction(async (tx) => {
      await tx.execute(sql`select set_config('lock_timeout', ${`${options.lockTimeoutMs}ms`}, true)`);
      await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${`softcrum.fence-day:${day}`}, 0))`);
      return step(tx as unknown as AnyPgDatabase);
    });
  const drop = (day: string) =>
    withLockRetries(options.lockRetries, () =>
      onDay(day, (tx) =>
        value<boolean>(
          tx,
          sql`select core.fence_partition_drop_detached(${day}::date, ${options.lockTimeoutMs}::int) as v`,
        ),
      ),
    );
  for (const { day, attached } of days) {
    if (options.signal?.aborted) break;
    if (!attached) {
      // Detached by an earlier run whose drop failed: its kept fences moved with the detach.
      if (!dryRun && (await drop(day))) droppedDays.push(day);
      continue;
    }
    const others = await value<boolean>(
      db,
      sql`select exists (select 1 from core.processed_jobs p where ${dayRange(day, "p")} and p.consumer not in ${names}) as v`,
    );
    if (others) {
      kept.push(day);
      continue;
    }
    let row: { detached: boolean; moved: string | number } | undefined;
    try {
      row = await withLockRetries(options.lockRetries, () =>
        onDay(day, async (tx) => {
          const detach = rowsOf<{ detached: boolean; moved: string | number }>(
            await tx.execute(
              sql`select detached, moved from core.fence_partition_detach(${day}::date, ${seconds}::float8, ${dryRun}, ${options.lockTimeoutMs}::int)`,
            ),
          )[0];
          // In the detach's transaction, so with its now(): after the
          // DETACH, whose lock waits must not hold a horizon row.
          if (detach?.detached && !dryRun) await tx.execute(horizonUpsert(names, seconds));
          return detach;
        }),
      );
    } catch (error) {
      if (!isLockTimeout(error)) throw error;
      deferred += 1;
      continue;
    }
    moved += Number(row?.moved ?? 0);
    if (dryRun) {
      droppedDays.push(day);
      continue;
    }
    if (!row?.detached) continue; // detached and dropped by another run meanwhile
    droppedDays.push(day);
    // A lock timeout here leaves the detached table to the next run.
    await drop(day).catch((error: unknown) => {
      if (!isLockTimeout(error)) throw error;
    });
  }
  return { dropped: droppedDays.length, droppedDays, moved, keptForOtherConsumers: kept, deferred };
}
