/**
 * #20 item 3: what each recurring job does, through the module's consumer on
 * real Postgres — snapshots from the ledger's window, stats, reconciliation
 * against the ledger, the expiring-soon scan, the retention purge (export to
 * rollups, then delete) and the snapshot partitions.
 */
import { createEnvelope, createManualClock, fanOutJobId } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { AWARD_POINTS_KIND, AWARD_POINTS_QUEUE, createAwardPointsConsumer, POINTS_VALID_DAYS } from "./award-points.ts";
import { createLoyaltyModule, type InProcessLoyaltyModule } from "./composition-root.ts";
import { RECURRING_KINDS, RECURRING_QUEUE } from "./recurring.ts";
import { EXPIRING_WITHIN_DAYS, RETENTION, SNAPSHOT_SETTLE_MS } from "./recurring-jobs.ts";

const pg = useModuleDatabase("loyalty-recurring-jobs");
let module: InProcessLoyaltyModule;
const failures: string[] = [];

beforeAll(async () => {
  module = await createLoyaltyModule({
    databaseUrl: pg.url,
    transport: "memory",
    notifier: { pointsAwarded: async () => {} },
    logger: { warn: () => {}, error: () => {} },
    clock: createManualClock(Date.now()),
  });
  module.queue.onDelivery((e) => {
    if (e.result.outcome !== "success" && e.result.outcome !== "duplicate") failures.push(e.result.outcome);
  });
});
afterAll(async () => {
  await module?.close();
});
beforeEach(async () => {
  failures.length = 0;
  await pg.sql`truncate loyalty.ledger, loyalty.balances, loyalty.tenant_stats, loyalty.consumption_snapshots,
    loyalty.reconciliations, loyalty.reconciliation_discrepancies, loyalty.points_expiring_soon,
    loyalty.ledger_rollups, core.processed_jobs, core.dead_letters cascade`;
});

const TICK = new Date("2026-12-02T00:00:00.000Z");
const MIN = 60_000;
const DAY = 86_400_000;
const plus = (ms: number, from = TICK) => new Date(from.getTime() + ms).toISOString();

/** Rows with their timestamps as Dates (the test pool, shared with Drizzle, reads them as text). */
const dated = (rows: readonly Record<string, unknown>[]) =>
  rows.map((row) =>
    Object.fromEntries(
      Object.entries(row).map(([k, v]) => [
        k,
        typeof v === "string" && /^\d{4}-\d\d-\d\d \d/.test(v) ? new Date(v) : v,
      ]),
    ),
  );

/** One job of `kind` for `tenant` at `tick`, run through the recurring consumer. */
async function run(kind: string, tenant: string, tick = TICK) {
  const envelope = createEnvelope({
    jobId: fanOutJobId({ kind, tenantId: tenant, tick }),
    tenantId: tenant,
    kind,
    data: { tick: tick.toISOString() },
  });
  await module.queue.publish(RECURRING_QUEUE, envelope);
  await module.queue.drain();
  expect(failures).toEqual([]);
}

/** A credit as the award consumer writes it (ledger row and balance), at a chosen time. */
async function credit(tenant: string, customer: string, points: number, createdAt: string, expiresAt?: string) {
  await pg.sql`
    insert into loyalty.ledger (job_id, tenant_id, customer_id, points, reason, created_at, expires_at)
    values (gen_random_uuid(), ${tenant}, ${customer}, ${points}, 'purchase', ${createdAt}, ${expiresAt ?? null})`;
  await pg.sql`
    insert into loyalty.balances (tenant_id, customer_id, points) values (${tenant}, ${customer}, ${points})
    on conflict (tenant_id, customer_id) do update set points = balances.points + excluded.points`;
}

describe("the recurring jobs' effects", () => {
  test("an award sets the credit's expiry POINTS_VALID_DAYS after it", async () => {
    const job = createEnvelope({
      tenantId: "acme",
      kind: AWARD_POINTS_KIND,
      data: { customerId: "c", points: 5, reason: "r" },
    });
    await module.queue.publish(AWARD_POINTS_QUEUE, job);
    await module.settle();
    const [row] = await pg.sql<{ days: number }[]>`
      select extract(epoch from expires_at - created_at)::int / 86400 as days from loyalty.ledger where job_id = ${job.job_id}`;
    expect(row?.days).toBe(POINTS_VALID_DAYS);
  });

  test("a consumption snapshot counts the credits of the 30 minutes ending SNAPSHOT_SETTLE_MS before its tick, one row per tenant", async () => {
    await run(RECURRING_KINDS.partitions, "_platform"); // the tick's month has its partition, whenever this runs
    // The settle time covers the longest a credit's transaction can stay open (its consumer's timeout).
    expect(createAwardPointsConsumer().timeoutMs).toBeLessThan(SNAPSHOT_SETTLE_MS);
    const end = -SNAPSHOT_SETTLE_MS;
    await credit("acme", "c-1", 10, plus(end - 30 * MIN)); // the window's first instant
    await credit("acme", "c-1", 5, plus(end - 1));
    await credit("acme", "c-2", 7, plus(end - 10 * MIN));
    await credit("acme", "c-3", 100, plus(end)); // the next window's
    await credit("acme", "c-3", 100, plus(end - 30 * MIN - 1)); // the previous window's
    await credit("globex", "c-1", 1, plus(end - MIN));
    for (const tenant of ["acme", "globex", "initech"]) await run(RECURRING_KINDS.consumptionSnapshot, tenant);
    const rows = await pg.sql`
      select tenant_id, taken_at, credits, points::int, customers from loyalty.consumption_snapshots order by tenant_id`;
    expect(dated(rows)).toEqual([
      { tenant_id: "acme", taken_at: TICK, credits: 3, points: 22, customers: 2 },
      { tenant_id: "globex", taken_at: TICK, credits: 1, points: 1, customers: 1 },
      { tenant_id: "initech", taken_at: TICK, credits: 0, points: 0, customers: 0 },
    ]);
  });

  test("the freshness recompute writes the tenant's stats for its tick; an older tick arriving late changes nothing", async () => {
    await credit("acme", "c-1", 10, plus(-2 * DAY));
    await credit("acme", "c-2", 4, plus(-3 * 60 * MIN));
    await run(RECURRING_KINDS.freshness, "acme");
    const stats = () => pg.sql`
      select customers, points::int, last_credit_at, computed_for from loyalty.tenant_stats where tenant_id = 'acme'`;
    expect(dated(await stats())).toEqual([
      { customers: 2, points: 14, last_credit_at: new Date(plus(-3 * 60 * MIN)), computed_for: TICK },
    ]);
    await credit("acme", "c-3", 1, plus(-MIN));
    await run(RECURRING_KINDS.freshness, "acme", new Date(TICK.getTime() - 60 * MIN));
    expect(dated(await stats())).toEqual([
      { customers: 2, points: 14, last_credit_at: new Date(plus(-3 * 60 * MIN)), computed_for: TICK },
    ]);
    await run(RECURRING_KINDS.freshness, "acme", new Date(TICK.getTime() + 60 * MIN));
    expect((await stats())[0]).toMatchObject({ customers: 3, points: 15 });
  });

  test("the reconciliation records the run and every customer whose balance is not the sum of their credits", async () => {
    await credit("acme", "ok", 10, plus(-DAY));
    await credit("acme", "ok", 5, plus(-DAY));
    await credit("acme", "drifted", 8, plus(-DAY));
    await pg.sql`update loyalty.balances set points = points + 2 where customer_id = 'drifted'`;
    await pg.sql`insert into loyalty.balances (tenant_id, customer_id, points) values ('acme', 'no-credits', 3)`;
    await pg.sql`
      insert into loyalty.ledger (job_id, tenant_id, customer_id, points, reason)
      values (gen_random_uuid(), 'acme', 'no-balance', 6, 'purchase')`;
    await credit("globex", "drifted-elsewhere", 1, plus(-DAY)); // another tenant's: not this job's
    await pg.sql`update loyalty.balances set points = 0 where tenant_id = 'globex'`;
    await run(RECURRING_KINDS.reconciliation, "acme");
    expect(
      dated(await pg.sql`select tenant_id, checked_at, customers, discrepancies from loyalty.reconciliations`),
    ).toEqual([{ tenant_id: "acme", checked_at: TICK, customers: 4, discrepancies: 3 }]);
    const found = await pg.sql`
      select customer_id, balance::int, expected::int from loyalty.reconciliation_discrepancies
       where tenant_id = 'acme' and checked_at = ${TICK.toISOString()} order by customer_id`;
    expect(found).toEqual([
      { customer_id: "drifted", balance: 10, expected: 8 },
      { customer_id: "no-balance", balance: null, expected: 6 },
      { customer_id: "no-credits", balance: 3, expected: null },
    ]);
  });

  test("the expiring-soon scan lists customers with points lapsing within EXPIRING_WITHIN_DAYS of the tick", async () => {
    const within = EXPIRING_WITHIN_DAYS * DAY;
    await credit("acme", "c-1", 10, plus(-300 * DAY), plus(10 * DAY));
    await credit("acme", "c-1", 5, plus(-200 * DAY), plus(within)); // the last day counts
    await credit("acme", "c-1", 50, plus(-100 * DAY), plus(within + 1)); // not yet
    await credit("acme", "c-2", 7, plus(-364 * DAY), plus(DAY));
    await credit("acme", "c-3", 9, plus(-400 * DAY), plus(-DAY)); // lapsed already
    await credit("acme", "c-4", 9, plus(-400 * DAY)); // never lapses
    await credit("globex", "c-1", 1, plus(-300 * DAY), plus(DAY));
    await run(RECURRING_KINDS.pointsExpiringSoon, "acme");
    const rows = await pg.sql`
      select customer_id, points::int, first_expires_at from loyalty.points_expiring_soon
       where tenant_id = 'acme' and scanned_at = ${TICK.toISOString()} order by customer_id`;
    expect(dated(rows)).toEqual([
      { customer_id: "c-1", points: 15, first_expires_at: new Date(plus(10 * DAY)) },
      { customer_id: "c-2", points: 7, first_expires_at: new Date(plus(DAY)) },
    ]);
    expect(await pg.sql`select 1 from loyalty.points_expiring_soon where tenant_id = 'globex'`).toHaveLength(0);
  });

  test("the retention purge moves credits past the retention into the customer's rollup (the balance still reconciles) and deletes old scan and reconciliation rows", async () => {
    const cutoff = -RETENTION.ledgerDays * DAY;
    await credit("acme", "c-1", 10, plus(cutoff - 100 * DAY));
    await credit("acme", "c-1", 20, plus(cutoff - 1));
    await credit("acme", "c-1", 5, plus(cutoff)); // exactly at the retention: kept
    await credit("acme", "c-2", 1, plus(-DAY));
    await credit("globex", "c-1", 99, plus(cutoff - DAY)); // another tenant's
    const scanned = (days: number) => plus(-days * DAY);
    await pg.sql`
      insert into loyalty.points_expiring_soon (tenant_id, scanned_at, customer_id, points, first_expires_at)
      values ('acme', ${scanned(RETENTION.expiringScanDays + 1)}, 'c-1', 1, now()),
             ('acme', ${scanned(RETENTION.expiringScanDays)}, 'c-1', 1, now()),
             ('globex', ${scanned(RETENTION.expiringScanDays + 1)}, 'c-1', 1, now())`;
    await pg.sql`
      insert into loyalty.reconciliations (tenant_id, checked_at, customers, discrepancies)
      values ('acme', ${scanned(RETENTION.reconciliationDays + 1)}, 1, 1), ('acme', ${scanned(1)}, 1, 0)`;
    await pg.sql`
      insert into loyalty.reconciliation_discrepancies (tenant_id, checked_at, customer_id, balance, expected)
      values ('acme', ${scanned(RETENTION.reconciliationDays + 1)}, 'c-1', 1, 2)`;
    await run(RECURRING_KINDS.retentionPurge, "acme");

    const rollups =
      await pg.sql`select tenant_id, customer_id, points::int, credits, through from loyalty.ledger_rollups`;
    expect(dated(rollups)).toEqual([
      { tenant_id: "acme", customer_id: "c-1", points: 30, credits: 2, through: new Date(plus(cutoff - 1)) },
    ]);
    const ledger = await pg.sql`select tenant_id, customer_id, points from loyalty.ledger order by tenant_id, points`;
    expect(ledger).toEqual([
      { tenant_id: "acme", customer_id: "c-2", points: 1 },
      { tenant_id: "acme", customer_id: "c-1", points: 5 },
      { tenant_id: "globex", customer_id: "c-1", points: 99 },
    ]);
    const left = await pg.sql<{ scans: number; runs: number; discrepancies: number }[]>`
      select (select count(*)::int from loyalty.points_expiring_soon) as scans,
             (select count(*)::int from loyalty.reconciliations) as runs,
             (select count(*)::int from loyalty.reconciliation_discrepancies) as discrepancies`;
    expect(left[0]).toEqual({ scans: 2, runs: 1, discrepancies: 0 });
    // The next night moves the credit that crossed the retention since, and the balances reconcile against rollup + ledger.
    await run(RECURRING_KINDS.retentionPurge, "acme", new Date(TICK.getTime() + DAY));
    await run(RECURRING_KINDS.reconciliation, "acme", new Date(TICK.getTime() + DAY));
    expect((await pg.sql`select points::int, credits from loyalty.ledger_rollups`)[0]).toEqual({
      points: 35,
      credits: 3,
    });
    expect(
      await pg.sql`select customers, discrepancies from loyalty.reconciliations where checked_at > ${TICK.toISOString()}`,
    ).toEqual([{ customers: 2, discrepancies: 0 }]);
  });

  test("the partitions job creates the tick's month and the next, and drops the months wholly past the snapshot retention", async () => {
    const partitions = async () =>
      (
        await pg.sql<{ name: string }[]>`
          select c.relname as name from pg_inherits i join pg_class c on c.oid = i.inhrelid
           where i.inhparent = 'loyalty.consumption_snapshots'::regclass and c.relkind = 'r' order by 1`
      ).map((r) => r.name);
    const tick = new Date("2031-05-01T00:00:00.000Z");
    // March 2030 ended 13 months before the tick; April 2030 did not end until 12 months before it.
    for (const month of ["03", "04"]) {
      await pg.sql.unsafe(`create table loyalty.consumption_snapshots_y2030m${month} partition of loyalty.consumption_snapshots
        for values from ('2030-${month}-01T00:00:00Z') to ('2030-${month}-01T00:00:00Z'::timestamptz + interval '1 month')`);
    }
    await pg.sql`
      insert into loyalty.consumption_snapshots (tenant_id, taken_at, credits, points, customers)
      values ('acme', '2030-03-31T23:30:00Z', 1, 1, 1), ('acme', '2030-04-01T00:00:00Z', 1, 1, 1)`;
    await run(RECURRING_KINDS.partitions, "_platform", tick);
    const after = await partitions();
    expect(after).toEqual(expect.arrayContaining(["consumption_snapshots_y2031m05", "consumption_snapshots_y2031m06"]));
    expect(after).toContain("consumption_snapshots_y2030m04");
    // Every older month is gone: March 2030, and the months the migration made when the tests began.
    expect(after.filter((n) => n < "consumption_snapshots_y2030m04")).toEqual([]);
    // A snapshot of the new month has somewhere to go; the dropped month's rows went with it.
    await pg.sql`
      insert into loyalty.consumption_snapshots (tenant_id, taken_at, credits, points, customers)
      values ('acme', '2031-06-15T00:00:00Z', 0, 0, 0)`;
    expect(
      (await pg.sql`select taken_at from loyalty.consumption_snapshots where taken_at < '2031-01-01' order by 1`).map(
        (r) => new Date(r["taken_at"]),
      ),
    ).toEqual([new Date("2030-04-01T00:00:00Z")]);
    // The next day: nothing to create or drop.
    await run(RECURRING_KINDS.partitions, "_platform", new Date(tick.getTime() + DAY));
    expect(await partitions()).toEqual(after);
  });

  test("a job whose tick is off its task's boundaries is dead-lettered, not run", async () => {
    const envelope = createEnvelope({
      tenantId: "acme",
      kind: RECURRING_KINDS.consumptionSnapshot,
      data: { tick: plus(MIN) },
    });
    await module.queue.publish(RECURRING_QUEUE, envelope);
    await module.queue.drain();
    expect(failures).toEqual(["dead_lettered"]);
    failures.length = 0;
    const [letter] = await pg.sql`select last_error from core.dead_letters where job_id = ${envelope.job_id}`;
    expect(letter?.["last_error"]).toMatch(/not on a boundary of its period/);
  });
});
