/**
 * The loyalty module's recurring work (#20 item 3; SPEC §7, seed 001): each
 * task is a `FanOutTask` — one job per tenant per tick, its job_id derived
 * from (kind, tenant, tick), so a retried cron, a worker loop and a cron both
 * running, or a tick replayed by hand apply each tenant's job once through
 * the consumer's fence (recurring-jobs.ts does the work).
 *
 * Periods: the seed gives two — freshness recomputes by entitlement tier
 * (nightly/12h/6h/3h/1h: an hourly tick selecting the tenants whose tier is
 * due, `tiersDue`) and consumption snapshots every 30 min — and names the
 * reconciliation nightly. It gives none for the expiring-soon scan, the
 * retention purge or partition pre-creation: they run daily, since expiry
 * and retention are counted in days and a month's partition is made weeks
 * before it is needed. Daily ticks fall at 00:00 UTC.
 *
 * Per tenant or platform-wide: every task that reads or writes a tenant's own
 * rows is per tenant (its cost grows with that tenant alone, a failure is
 * retried or dead-lettered for that tenant alone). Partition pre-creation is
 * one platform-wide job: `consumption_snapshots` is one table partitioned by
 * month for all tenants (partitions per tenant would be 100,000 tables a
 * month), so there is one DDL per month to run, and 100,000 jobs repeating it
 * would only queue up on the table's lock. It still goes through the same
 * fan-out with a one-element tenant source (`platformOnly`), so a retried
 * cron is a no-op through the fence like every other tick.
 */
import { type AnyPgDatabase, type FanOutReport, type FanOutTask, type QueuePort, runFanOutTick } from "@softcrum/core";
import { everyTenant, platformOnly, tenantsDueAt } from "./tenants.ts";

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** One queue and one consumer for every recurring kind (`createRecurringConsumer` dispatches by kind). */
export const RECURRING_QUEUE = "loyalty.recurring";

export const RECURRING_KINDS = {
  freshness: "loyalty.freshness.v1",
  consumptionSnapshot: "loyalty.consumption-snapshot.v1",
  reconciliation: "loyalty.reconciliation.v1",
  pointsExpiringSoon: "loyalty.points-expiring-soon.v1",
  retentionPurge: "loyalty.retention-purge.v1",
  partitions: "loyalty.partitions.v1",
} as const;
export type RecurringKind = (typeof RECURRING_KINDS)[keyof typeof RECURRING_KINDS];

/** Which tenants a tick selects. */
export type TenantSelection = "tiers-due" | "every-tenant" | "platform";

export interface RecurringTask {
  /** The task's name: the audit's `fanout.{name}` and the cron route's path. */
  readonly name: string;
  readonly kind: RecurringKind;
  readonly everyMs: number;
  readonly tenants: TenantSelection;
}

/** The module's recurring tasks, as data: the worker, the cron routes and vercel.json all read this list. */
export const RECURRING_TASKS: readonly RecurringTask[] = [
  { name: "loyalty.freshness", kind: RECURRING_KINDS.freshness, everyMs: HOUR, tenants: "tiers-due" },
  {
    name: "loyalty.consumption-snapshot",
    kind: RECURRING_KINDS.consumptionSnapshot,
    everyMs: 30 * MINUTE,
    tenants: "every-tenant",
  },
  { name: "loyalty.reconciliation", kind: RECURRING_KINDS.reconciliation, everyMs: DAY, tenants: "every-tenant" },
  {
    name: "loyalty.points-expiring-soon",
    kind: RECURRING_KINDS.pointsExpiringSoon,
    everyMs: DAY,
    tenants: "every-tenant",
  },
  { name: "loyalty.retention-purge", kind: RECURRING_KINDS.retentionPurge, everyMs: DAY, tenants: "every-tenant" },
  { name: "loyalty.partitions", kind: RECURRING_KINDS.partitions, everyMs: DAY, tenants: "platform" },
];

/** The period of each recurring kind (the consumer checks a job's tick falls on one). */
export const PERIOD_OF_KIND: ReadonlyMap<string, number> = new Map(RECURRING_TASKS.map((t) => [t.kind, t.everyMs]));

/** The tasks as `FanOutTask`s, their tenants read from `db`. */
export function loyaltyRecurringTasks(db: AnyPgDatabase): FanOutTask[] {
  const sources = { "tiers-due": tenantsDueAt(db), "every-tenant": everyTenant(db), platform: platformOnly };
  return RECURRING_TASKS.map((task) => ({
    name: task.name,
    queueName: RECURRING_QUEUE,
    kind: task.kind,
    everyMs: task.everyMs,
    tenants: sources[task.tenants],
  }));
}

/** One tick of a task, e.g. a tick the worker missed while it was down, replayed by hand (core's runFanOutTick). */
export const runRecurringTick: (task: FanOutTask, queue: QueuePort, tick: Date) => Promise<FanOutReport> =
  runFanOutTick;
