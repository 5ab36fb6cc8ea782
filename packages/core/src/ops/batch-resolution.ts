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
import type { BatchView, SampleReport } from "./batch-input.ts";
import { rowsOf } from "./ops-helpers.ts";
import type { BatchRecoveryReport } from "./ops-types.ts";

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
  // Through the database's function: operators have no UPDATE on the batch's row.
  await db.execute(
    sql`select core.ops_batch_record_item(${id}::uuid, ${deadLetterId}::uuid, ${state}, ${now.toISOString()}::timestamptz)`,
  );
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
  // Through the database's function (ops_batch_resolve), for the same reason.
  const result = await db.execute(
    sql`select succeeded, failed_again from core.ops_batch_resolve(${id}::uuid, ${now.toISOString()}::timestamptz, ${RESOLVE_PAGE})`,
  );
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
  // One definition, in the database: ops_batch_resolve uses it too.
  return sql`select * from core.ops_replay_outcome(d.id, d.job_id, d.consumer, d.status_changed_at)`;
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

/** The sample's replays, job by job, beside the selection's error classes (#21 item 7); bounded by the sample's size. */
export async function sampleReport(db: Db, id: string): Promise<SampleReport> {
  const items = rowsOf<{
    id: string;
    error_class: string;
    last_error: string;
    resolution: string | null;
    new_class: string | null;
    new_error: string | null;
  }>(
    await db.execute(sql`
      select i.dead_letter_id::text as id, d.error_class, left(d.last_error, 200) as last_error, i.resolution,
             n.error_class as new_class, left(n.last_error, 200) as new_error
      from core.replay_batch_items i
      join core.dead_letters d on d.id = i.dead_letter_id
      left join lateral (select n.error_class, n.last_error from core.dead_letters n
                         where n.job_id = d.job_id and n.consumer = d.consumer and n.id <> d.id
                           and n.created_at >= d.status_changed_at
                         order by n.created_at limit 1) n on i.resolution = 'failed_again'
      where i.batch_id = ${id} and i.in_sample and i.state = 'replayed'
      order by i.position`),
  );
  const classes = rowsOf<{ error_class: string; n: number }>(
    await db.execute(sql`
      select d.error_class, count(*)::int as n from core.replay_batch_items i
      join core.dead_letters d on d.id = i.dead_letter_id
      where i.batch_id = ${id} group by d.error_class order by d.error_class`),
  );
  const [left] = rowsOf<{ n: number }>(
    await db.execute(sql`
      select count(*)::int as n from core.replay_batch_items where batch_id = ${id} and state = 'pending'`),
  );
  return {
    batchId: id,
    items: items.map((r) => ({
      deadLetterId: r.id,
      errorClass: r.error_class,
      lastError: r.last_error,
      outcome: r.resolution ?? "unresolved",
      newErrorClass: r.new_class,
      newError: r.new_error,
    })),
    selection: Object.fromEntries(classes.map((c) => [c.error_class, c.n])),
    remaining: left?.n ?? 0,
  };
}

/** A batch's view as the recovery report its metric carries. */
export function recoveryOf(batch: BatchView): BatchRecoveryReport {
  return {
    batchId: batch.id,
    status: batch.status,
    replayed: batch.replayed,
    succeeded: batch.succeeded,
    failedAgain: batch.failedAgain,
    inFlight: batch.unresolved,
    duplicates: batch.duplicates,
    timeToRecoveryMs: batch.timeToRecoveryMs,
  };
}
