/**
 * The consumer of the module's recurring jobs (recurring.ts declares the
 * tasks): one consumer on one queue, dispatching by kind. Every handler does
 * its work through `tx`, the harness's work transaction, so the effect and
 * the fence commit together: a tick published twice (a retried cron, a loop
 * and a cron) applies once. Each handler is one tenant's rows — except the
 * partitions job, which is platform-wide (see recurring.ts) — and most are a
 * single statement, so a concurrent credit is either wholly in what it reads
 * or wholly out of it.
 */
import { defineConsumer, PermanentError, type WorkTransaction } from "@softcrum/core";
import { sql } from "drizzle-orm";
import { z } from "zod";
import { PERIOD_OF_KIND, RECURRING_KINDS, RECURRING_QUEUE, type RecurringKind } from "./recurring.ts";

const DAY = 86_400_000;

/** The expiring-soon scan lists points lapsing within this many days of its tick. */
export const EXPIRING_WITHIN_DAYS = 30;

/** What the module keeps, and for how long; the retention purge and the partitions job enforce it. */
export const RETENTION = {
  /** Credits older than this leave the ledger for `ledger_rollups` (twice POINTS_VALID_DAYS: long expired). */
  ledgerDays: 730,
  /** Expiring-soon scan results. */
  expiringScanDays: 90,
  /** Reconciliation runs and their discrepancies: a year and a month, for year-on-year comparison. */
  reconciliationDays: 400,
  /** Consumption snapshots, by whole month partitions: a month goes once all of it is older than this. */
  snapshotMonths: 13,
} as const;

/** At most this many credits move per tenant per purge: a run stays well inside the handler's timeout; the next night goes on. */
export const PURGE_MAX_ROWS = 50_000;

/**
 * A snapshot covers the 30 minutes ending this long before its tick. A
 * credit's `created_at` is its transaction's start, and the award consumer's
 * transaction is bounded by its timeoutMs (25 s): every credit stamped
 * before the window's end has committed or rolled back by the time the
 * snapshot reads it, so none lands in a window already taken.
 */
export const SNAPSHOT_SETTLE_MS = 60_000;
const SNAPSHOT_WINDOW_MS = 30 * 60_000;

const ts = (at: Date) => sql`${at.toISOString()}::timestamptz`;
const daysBefore = (at: Date, days: number) => new Date(at.getTime() - days * DAY);
const monthStart = (at: Date, plusMonths = 0) =>
  new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth() + plusMonths, 1));
const partitionName = (month: Date) =>
  `consumption_snapshots_y${month.getUTCFullYear()}m${String(month.getUTCMonth() + 1).padStart(2, "0")}`;
const PARTITION_NAME = /^consumption_snapshots_y(\d{4})m(\d{2})$/;

/** Rows of `tx.execute`, whichever driver: postgres.js answers an array, PGlite `{ rows }`. */
function rowsOf<T>(result: unknown): T[] {
  return (Array.isArray(result) ? result : (result as { rows: T[] }).rows) as T[];
}

type Handler = (tx: WorkTransaction, tenantId: string, tick: Date) => Promise<void>;

/** Recomputes the tenant's stats (its freshness tier decides how often); an older tick never overwrites a newer one. */
const recomputeFreshness: Handler = async (tx, tenantId, tick) => {
  await tx.execute(sql`
    insert into loyalty.tenant_stats (tenant_id, customers, points, last_credit_at, computed_for)
    select ${tenantId}, count(*)::int, coalesce(sum(points), 0),
           (select max(created_at) from loyalty.ledger where tenant_id = ${tenantId}), ${ts(tick)}
      from loyalty.balances where tenant_id = ${tenantId}
    on conflict (tenant_id) do update
       set customers = excluded.customers, points = excluded.points, last_credit_at = excluded.last_credit_at,
           computed_for = excluded.computed_for, computed_at = now()
     where tenant_stats.computed_for < excluded.computed_for`);
};

/** One row per tenant per tick: the credits, points and distinct customers of the window ending at the tick. */
const snapshotConsumption: Handler = async (tx, tenantId, tick) => {
  const to = new Date(tick.getTime() - SNAPSHOT_SETTLE_MS);
  const from = new Date(to.getTime() - SNAPSHOT_WINDOW_MS);
  await tx.execute(sql`
    insert into loyalty.consumption_snapshots (tenant_id, taken_at, credits, points, customers)
    select ${tenantId}, ${ts(tick)}, count(*)::int, coalesce(sum(points), 0), count(distinct customer_id)::int
      from loyalty.ledger
     where tenant_id = ${tenantId} and created_at >= ${ts(from)} and created_at < ${ts(to)}`);
};

/**
 * Compares each customer's balance with the sum of their credits (the
 * rolled-up ones included), records every customer where they differ — a
 * balance without credits and credits without a balance too — and one row
 * for the run, so "checked, all agree" is visible as well.
 */
const reconcile: Handler = async (tx, tenantId, tick) => {
  await tx.execute(sql`
    with expected as (
      select customer_id, sum(points)::bigint as points from (
        select customer_id, points from loyalty.ledger where tenant_id = ${tenantId}
        union all
        select customer_id, points from loyalty.ledger_rollups where tenant_id = ${tenantId}
      ) credits group by customer_id
    ), compared as (
      select coalesce(b.customer_id, e.customer_id) as customer_id, b.points::bigint as balance, e.points as expected
        from (select customer_id, points from loyalty.balances where tenant_id = ${tenantId}) b
        full join expected e on e.customer_id = b.customer_id
    ), found as (
      insert into loyalty.reconciliation_discrepancies (tenant_id, checked_at, customer_id, balance, expected)
      select ${tenantId}, ${ts(tick)}, customer_id, balance, expected
        from compared where balance is distinct from expected
      returning 1
    )
    insert into loyalty.reconciliations (tenant_id, checked_at, customers, discrepancies)
    select ${tenantId}, ${ts(tick)}, (select count(*) from compared)::int, (select count(*) from found)::int`);
};

/**
 * Customers with points lapsing in (tick, tick + EXPIRING_WITHIN_DAYS]: how
 * many and the first date. The module only credits (nothing redeems points
 * yet), so a credit's points are all still there until it expires.
 */
const scanExpiringSoon: Handler = async (tx, tenantId, tick) => {
  const until = new Date(tick.getTime() + EXPIRING_WITHIN_DAYS * DAY);
  await tx.execute(sql`
    insert into loyalty.points_expiring_soon (tenant_id, scanned_at, customer_id, points, first_expires_at)
    select ${tenantId}, ${ts(tick)}, customer_id, sum(points), min(expires_at)
      from loyalty.ledger
     where tenant_id = ${tenantId} and expires_at > ${ts(tick)} and expires_at <= ${ts(until)}
     group by customer_id`);
};

/**
 * Export and retention purge: credits older than the retention move from the
 * ledger into the customer's rollup in one statement (a concurrent
 * reconciliation sees them on one side or the other, never both or neither),
 * at most PURGE_MAX_ROWS a night; scan results and reconciliation records
 * past theirs are deleted.
 */
const purgeRetention: Handler = async (tx, tenantId, tick) => {
  await tx.execute(sql`
    with moved as (
      delete from loyalty.ledger where id in (
        select id from loyalty.ledger
         where tenant_id = ${tenantId} and created_at < ${ts(daysBefore(tick, RETENTION.ledgerDays))}
         order by created_at limit ${PURGE_MAX_ROWS})
      returning customer_id, points, created_at
    )
    insert into loyalty.ledger_rollups (tenant_id, customer_id, points, credits, through)
    select ${tenantId}, customer_id, sum(points), count(*)::int, max(created_at) from moved group by customer_id
    on conflict (tenant_id, customer_id) do update
       set points = ledger_rollups.points + excluded.points, credits = ledger_rollups.credits + excluded.credits,
           through = greatest(ledger_rollups.through, excluded.through)`);
  await tx.execute(sql`
    delete from loyalty.points_expiring_soon
     where tenant_id = ${tenantId} and scanned_at < ${ts(daysBefore(tick, RETENTION.expiringScanDays))}`);
  const reconciled = ts(daysBefore(tick, RETENTION.reconciliationDays));
  await tx.execute(sql`
    delete from loyalty.reconciliation_discrepancies where tenant_id = ${tenantId} and checked_at < ${reconciled}`);
  await tx.execute(sql`
    delete from loyalty.reconciliations where tenant_id = ${tenantId} and checked_at < ${reconciled}`);
};

/**
 * Platform-wide: creates the snapshot partitions of the tick's month and the
 * next (idempotent; running daily, a month's partition exists four weeks
 * before its first row), and drops the months wholly older than the
 * snapshot retention — the purge of the snapshots, one DROP per month
 * instead of deleting 144 M rows. Both lock the parent table for an
 * instant; lock_timeout makes a run that cannot get the lock fail and retry
 * rather than queue every snapshot insert behind it.
 */
const maintainPartitions: Handler = async (tx, _tenantId, tick) => {
  await tx.execute(sql`set local lock_timeout = '5s'`);
  for (const month of [monthStart(tick), monthStart(tick, 1)]) {
    // DDL takes no bind parameters: the bounds are ISO strings this code made.
    await tx.execute(sql`
      create table if not exists loyalty.${sql.identifier(partitionName(month))}
        partition of loyalty.consumption_snapshots
        for values from ('${sql.raw(month.toISOString())}') to ('${sql.raw(monthStart(month, 1).toISOString())}')`);
  }
  const cutoff = monthStart(tick, -RETENTION.snapshotMonths);
  const partitions = rowsOf<{ name: string }>(
    await tx.execute(sql`
      select c.relname as name from pg_inherits i join pg_class c on c.oid = i.inhrelid
       where i.inhparent = 'loyalty.consumption_snapshots'::regclass and c.relkind = 'r'`),
  );
  for (const { name } of partitions) {
    const match = PARTITION_NAME.exec(name);
    if (!match) continue; // not one of ours: left alone
    const end = new Date(Date.UTC(Number(match[1]), Number(match[2]), 1));
    if (end <= cutoff) await tx.execute(sql`drop table loyalty.${sql.identifier(name)}`);
  }
};

const HANDLERS: Record<RecurringKind, Handler> = {
  [RECURRING_KINDS.freshness]: recomputeFreshness,
  [RECURRING_KINDS.consumptionSnapshot]: snapshotConsumption,
  [RECURRING_KINDS.reconciliation]: reconcile,
  [RECURRING_KINDS.pointsExpiringSoon]: scanExpiringSoon,
  [RECURRING_KINDS.retentionPurge]: purgeRetention,
  [RECURRING_KINDS.partitions]: maintainPartitions,
};

/** The fan-out's default job data: the tick, as ISO 8601. */
export const recurringJobData = z.object({ tick: z.iso.datetime() });

export function createRecurringConsumer() {
  return defineConsumer({
    name: "loyalty.recurring",
    queue: RECURRING_QUEUE,
    kind: Object.values(RECURRING_KINDS),
    schema: recurringJobData,
    async handle(data, { tx, envelope }) {
      const kind = envelope.kind as RecurringKind;
      const tick = new Date(data.tick);
      // A tick off its task's boundaries was not made by the fan-out: windows and cutoffs would be wrong.
      const period = PERIOD_OF_KIND.get(kind) as number;
      if (tick.getTime() % period !== 0) {
        throw new PermanentError(`${kind}: tick ${data.tick} is not on a boundary of its period (${period} ms)`);
      }
      await HANDLERS[kind](tx, envelope.tenant_id, tick);
    },
  });
}
