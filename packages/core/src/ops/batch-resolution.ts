/**
 * The SQL that resolves a batch's replayed items (moved out of batches.ts):
 * marking an item replayed or skipped, resolving what became of replayed
 * jobs (succeeded, duplicate, failed again) and counting it on the batch's
 * row, and the read-only looks at the sample and at what is not resolved yet.
 * Each takes the database and the batch id.
 */
import { sql } from "drizzle-orm";
import type { ReplayBatchRow } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import type { BatchView } from "./batch-input.ts";
import { rowsOf } from "./ops-helpers.ts";

type Db = Pick<AnyPgDatabase, "execute">;

/** Replayed items a runner step resolves at most (and `get` looks at live). */
export const RESOLVE_PAGE = 1000;

/** Marks a pending item replayed or skipped and counts it on the row, in one statement (once: a second mark finds it no longer pending). */
export async function recordItem(
  db: Db,
  id: string,
  deadLetterId: string,
  state: "replayed" | "skipped",
  now: Date,
): Promise<void> {
  await db.execute(sql`
    with marked as (
      update core.replay_batch_items set state = ${state}, replayed_at = ${now.toISOString()}::timestamptz
      where batch_id = ${id} and dead_letter_id = ${deadLetterId} and state = 'pending'
      returning 1)
    update core.replay_batches
    set ${state === "replayed" ? sql`replayed = replayed + 1` : sql`skipped = skipped + 1`}
    where id = ${id} and exists (select 1 from marked)`);
}

/**
 * Resolves at most `RESOLVE_PAGE` of the batch's replayed items not
 * resolved yet, oldest replay first: an item whose job has a fence
 * succeeded, one with a newer dead letter of the same job and consumer
 * (whose latest earlier replay is this one) failed again; both are final.
 * The row's counts (and the failure-rate window's) grow by what it found,
 * in the same statement, so a resolution is counted exactly once.
 */
export async function resolveReplayed(
  db: Db,
  id: string,
  now: Date,
): Promise<{ succeeded: number; failedAgain: number }> {
  const result = await db.execute(sql`
    with page as (
      select i.dead_letter_id, i.replayed_at, f.failed, f.succeeded, f.duplicate
      from core.replay_batch_items i
      join core.dead_letters d on d.id = i.dead_letter_id
      cross join lateral (${outcomeOf()}) f
      where i.batch_id = ${id} and i.state = 'replayed' and i.resolution is null
      order by i.replayed_at
      limit ${RESOLVE_PAGE}
    ), done as (
      update core.replay_batch_items i
      set resolution = case when page.failed then 'failed_again' when page.duplicate then 'duplicate' else 'succeeded' end
      from page
      where i.batch_id = ${id} and i.dead_letter_id = page.dead_letter_id and i.resolution is null
        and (page.failed or page.succeeded)
      returning i.resolution, i.replayed_at
    ), counted as (
      select count(*) filter (where d.resolution = 'succeeded')::int as succeeded,
             count(*) filter (where d.resolution = 'failed_again')::int as failed_again,
             count(*) filter (where d.resolution = 'duplicate')::int as duplicates,
             count(*) filter (where d.resolution = 'succeeded' and d.replayed_at >= b.rate_window_start)::int as window_succeeded,
             count(*) filter (where d.resolution = 'failed_again' and d.replayed_at >= b.rate_window_start)::int as window_failed_again,
             count(*) filter (where d.resolution = 'duplicate' and d.replayed_at >= b.rate_window_start)::int as window_duplicates
      from done d cross join (select rate_window_start from core.replay_batches where id = ${id}) b
    ), bumped as (
      update core.replay_batches b
      set succeeded = b.succeeded + c.succeeded,
          failed_again = b.failed_again + c.failed_again,
          duplicates = b.duplicates + c.duplicates,
          window_succeeded = b.window_succeeded + c.window_succeeded,
          window_failed_again = b.window_failed_again + c.window_failed_again,
          window_duplicates = b.window_duplicates + c.window_duplicates,
          last_resolved_at = ${now.toISOString()}::timestamptz
      from counted c
      where b.id = ${id} and (c.succeeded > 0 or c.failed_again > 0 or c.duplicates > 0)
      returning 1
    )
    select succeeded, failed_again from counted`);
  const [row] = rowsOf<{ succeeded: number; failed_again: number }>(result);
  return { succeeded: row?.succeeded ?? 0, failedAgain: row?.failed_again ?? 0 };
}

/** The sample's replayed items by resolution (the sample is small: `sampleSize` items). */
export async function sampleStats(db: Db, id: string) {
  const result = await db.execute(sql`
    select count(*)::int as replayed,
           count(*) filter (where resolution = 'failed_again')::int as failed_again,
           count(*) filter (where resolution in ('succeeded', 'duplicate'))::int as succeeded
    from core.replay_batch_items
    where batch_id = ${id} and in_sample and state = 'replayed'`);
  const [row] = rowsOf<{ replayed: number; failed_again: number; succeeded: number }>(result);
  const replayed = row?.replayed ?? 0;
  const failedAgain = row?.failed_again ?? 0;
  const succeeded = row?.succeeded ?? 0;
  return { replayed, failedAgain, succeeded, unresolved: replayed - failedAgain - succeeded };
}

/** Read-only: what became of up to `RESOLVE_PAGE` replayed jobs not resolved on the row yet. */
export async function unresolvedNow(
  db: Db,
  id: string,
): Promise<{ succeeded: number; failedAgain: number; duplicates: number; lastResolvedAt: Date | null }> {
  const result = await db.execute(sql`
    select count(*) filter (where f.failed)::int as failed_again,
           count(*) filter (where not f.failed and f.succeeded and not f.duplicate)::int as succeeded,
           count(*) filter (where not f.failed and f.duplicate)::int as duplicates,
           max(f.resolved_at) as last_resolved_at
    from (select i.dead_letter_id from core.replay_batch_items i
          where i.batch_id = ${id} and i.state = 'replayed' and i.resolution is null
          order by i.replayed_at limit ${RESOLVE_PAGE}) i
    join core.dead_letters d on d.id = i.dead_letter_id
    cross join lateral (${outcomeOf()}) f`);
  const [row] = rowsOf<{
    succeeded: number;
    failed_again: number;
    duplicates: number;
    last_resolved_at: string | Date | null;
  }>(result);
  return {
    succeeded: row?.succeeded ?? 0,
    failedAgain: row?.failed_again ?? 0,
    duplicates: row?.duplicates ?? 0,
    lastResolvedAt: row?.last_resolved_at ? new Date(row.last_resolved_at) : null,
  };
}

/**
 * For a replayed letter `d`: whether its job now has a fence (succeeded) and
 * whether a later letter of the job and consumer exists whose latest earlier
 * replay is this one (failed again).
 */
export function outcomeOf() {
  return sql`
    select exists (select 1 from core.processed_jobs p where p.job_id = d.job_id::uuid and p.consumer = d.consumer) as succeeded,
           -- A fence older than the replay's claim: the job's work had been done before it was replayed.
           exists (select 1 from core.processed_jobs p where p.job_id = d.job_id::uuid and p.consumer = d.consumer
                   and p.processed_at < d.status_changed_at) as duplicate,
           (select max(t) from (select p.processed_at as t from core.processed_jobs p
                                where p.job_id = d.job_id::uuid and p.consumer = d.consumer
                                union all
                                select n.created_at from core.dead_letters n
                                where n.job_id = d.job_id and n.consumer = d.consumer and n.id <> d.id
                                  and n.created_at >= d.status_changed_at) r) as resolved_at,
           exists (select 1 from core.dead_letters n
                   where n.job_id = d.job_id and n.consumer = d.consumer and n.id <> d.id
                     and n.created_at >= d.status_changed_at
                     and not exists (select 1 from core.dead_letters o
                                     where o.job_id = d.job_id and o.consumer = d.consumer and o.id <> d.id
                                       and o.status = 'replayed'
                                       and o.status_changed_at > d.status_changed_at
                                       and o.status_changed_at <= n.created_at)) as failed`;
}

/**
 * A batch's view: the row's counts plus what `unresolvedNow` found resolved
 * live, what is still unresolved or pending, and the recovery proof
 * (#21 item 7): recovered only when every replayed job resolved and nothing
 * is left to replay.
 */
export function viewOf(batch: ReplayBatchRow, live: Awaited<ReturnType<typeof unresolvedNow>>): BatchView {
  const failedAgain = batch.failedAgain + live.failedAgain;
  const succeeded = batch.succeeded + live.succeeded;
  const duplicates = batch.duplicates + live.duplicates;
  const unresolved = Math.max(0, batch.replayed - failedAgain - succeeded - duplicates);
  const pending = Math.max(0, batch.selected - batch.replayed - batch.skipped);
  const recovered = unresolved === 0 && pending === 0;
  const resolvedAt = live.lastResolvedAt ?? batch.lastResolvedAt;
  return {
    ...batch,
    failedAgain,
    succeeded,
    duplicates,
    unresolved,
    pending,
    recovered,
    timeToRecoveryMs:
      recovered && batch.startedAt && resolvedAt
        ? Math.max(0, new Date(resolvedAt).getTime() - batch.startedAt.getTime())
        : null,
  };
}
