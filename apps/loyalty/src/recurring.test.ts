/**
 * #20 item 3: the module's recurring tasks fan out the right tenants — the
 * freshness recompute by the tiers due at the tick, the platform-wide job
 * once — and the same tick run twice at once applies each tenant's job once,
 * through the recurring consumer's fence, on real Postgres.
 */
import { createManualClock, type Envelope, type QueuePort, TIERS } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { createLoyaltyModule, type InProcessLoyaltyModule } from "./composition-root.ts";
import { RECURRING_KINDS, RECURRING_QUEUE, RECURRING_TASKS, runRecurringTick } from "./recurring.ts";
import { PLATFORM_TENANT } from "./tenants.ts";

const pg = useModuleDatabase("loyalty-recurring");
let module: InProcessLoyaltyModule;
const outcomes: string[] = [];

beforeAll(async () => {
  module = await createLoyaltyModule({
    databaseUrl: pg.url,
    transport: "memory",
    notifier: { pointsAwarded: async () => {} },
    logger: { warn: () => {}, error: () => {} },
    // A failing handler's retries run at once (drain moves the clock), so a failure shows as an outcome, not a hang.
    clock: createManualClock(Date.now()),
  });
  module.queue.onDelivery((event) => {
    if (event.consumer === "loyalty.recurring") outcomes.push(event.result.outcome);
  });
});
afterAll(async () => {
  await module?.close();
});
beforeEach(async () => {
  outcomes.length = 0;
  await pg.sql`truncate loyalty.tenants, loyalty.ledger, loyalty.balances, loyalty.tenant_stats,
    loyalty.consumption_snapshots, loyalty.reconciliations, loyalty.reconciliation_discrepancies,
    loyalty.points_expiring_soon, loyalty.ledger_rollups, core.processed_jobs, core.dead_letters cascade`;
});

const MIDNIGHT = new Date("2026-12-02T00:00:00.000Z");
const hour = (h: number) => new Date(MIDNIGHT.getTime() + h * 3_600_000);
const task = (name: string) => {
  const found = module.recurringTasks.find((t) => t.name === name);
  if (!found) throw new Error(`no task ${name}`);
  return found;
};

function recordingQueue() {
  const sent: Envelope[] = [];
  const queue: QueuePort = {
    publish: async (_q, envelope) => {
      sent.push(envelope);
      return { messageId: envelope.job_id, stored: true };
    },
    schedule: async (_q, envelope) => ({ messageId: envelope.job_id, stored: true }),
  };
  return { queue, sent };
}

/** Three tenants per tier: `nightly-1` … `1h-3`. */
async function tenantsOfEveryTier() {
  await pg.sql`
    insert into loyalty.tenants (tenant_id, tier)
    select tier || '-' || n, tier from unnest(${TIERS as unknown as string[]}::text[]) tier, generate_series(1, 3) n`;
  return TIERS.flatMap((tier) => [1, 2, 3].map((n) => `${tier}-${n}`)).sort();
}

describe("the recurring tasks", () => {
  test("are the seed's list, each with its period, on one queue, one kind each", () => {
    expect(RECURRING_TASKS.map((t) => [t.name, t.everyMs / 60_000, t.tenants])).toEqual([
      ["loyalty.freshness", 60, "tiers-due"],
      ["loyalty.consumption-snapshot", 30, "every-tenant"],
      ["loyalty.reconciliation", 1_440, "every-tenant"],
      ["loyalty.points-expiring-soon", 1_440, "every-tenant"],
      ["loyalty.retention-purge", 1_440, "every-tenant"],
      ["loyalty.partitions", 1_440, "platform"],
    ]);
    expect(new Set(module.recurringTasks.map((t) => t.kind))).toEqual(new Set(Object.values(RECURRING_KINDS)));
    expect(new Set(module.recurringTasks.map((t) => t.queueName))).toEqual(new Set([RECURRING_QUEUE]));
  });

  test("each tick selects its tenants: freshness the tiers due (00:00 all, 12:00 12h and finer, 03:00 3h and 1h, 01:00 1h), the others every tenant, partitions the platform once", async () => {
    const all = await tenantsOfEveryTier();
    const fannedOut = async (name: string, tick: Date) => {
      const { queue, sent } = recordingQueue();
      const report = await runRecurringTick(task(name), queue, tick);
      expect(report).toMatchObject({ failed: 0, unconfirmed: 0, published: sent.length });
      expect(new Set(sent.map((e) => e.kind))).toEqual(new Set([task(name).kind]));
      expect(sent.every((e) => (e.data as { tick: string }).tick === tick.toISOString())).toBe(true);
      return sent.map((e) => e.tenant_id).sort();
    };
    const ofTiers = (...tiers: string[]) => all.filter((id) => tiers.includes(id.split("-")[0] as string));
    expect(await fannedOut("loyalty.freshness", hour(0))).toEqual(all);
    expect(await fannedOut("loyalty.freshness", hour(12))).toEqual(ofTiers("12h", "6h", "3h", "1h"));
    expect(await fannedOut("loyalty.freshness", hour(3))).toEqual(ofTiers("3h", "1h"));
    expect(await fannedOut("loyalty.freshness", hour(1))).toEqual(ofTiers("1h"));
    for (const name of ["loyalty.reconciliation", "loyalty.points-expiring-soon", "loyalty.retention-purge"]) {
      expect(await fannedOut(name, hour(0))).toEqual(all);
    }
    expect(await fannedOut("loyalty.consumption-snapshot", new Date(MIDNIGHT.getTime() + 1_800_000))).toEqual(all);
    expect(await fannedOut("loyalty.partitions", hour(0))).toEqual([PLATFORM_TENANT]);
  });

  test("the tenants are read in pages of 500: 1,234 tenants in 3 pages, each published once", async () => {
    await pg.sql`
      insert into loyalty.tenants (tenant_id) select 't-' || lpad(i::text, 5, '0') from generate_series(1, 1234) i`;
    const { queue, sent } = recordingQueue();
    const report = await runRecurringTick(task("loyalty.reconciliation"), queue, MIDNIGHT);
    expect(report).toMatchObject({ pages: 3, tenants: 1_234, published: 1_234, failed: 0 });
    expect(new Set(sent.map((e) => e.tenant_id)).size).toBe(1_234);
  });

  test("a tick run twice at once, and once more later, applies each tenant's job of every task exactly once", async () => {
    const all = await tenantsOfEveryTier();
    // One credit per tenant inside the 00:00 snapshot's window, expiring within the scan's 30 days; one past retention.
    await pg.sql`
      insert into loyalty.ledger (job_id, tenant_id, customer_id, points, reason, created_at, expires_at)
      select gen_random_uuid(), t.tenant_id, 'c-1', 10, 'purchase', ${hour(-0.5).toISOString()}::timestamptz,
             ${hour(24 * 10).toISOString()}::timestamptz
        from loyalty.tenants t
      union all
      select gen_random_uuid(), t.tenant_id, 'c-old', 3, 'purchase', ${hour(-24 * 800).toISOString()}::timestamptz, null
        from loyalty.tenants t where t.tier = '1h'`;
    await pg.sql`
      insert into loyalty.balances (tenant_id, customer_id, points)
      select tenant_id, customer_id, sum(points) from loyalty.ledger group by tenant_id, customer_id`;
    // The partitions job first: the snapshots' month must have its partition whatever month the tests run in.
    const tick = (name: string) => runRecurringTick(task(name), module.queue, MIDNIGHT);
    await tick("loyalty.partitions");
    await module.queue.drain();
    let jobs = 1;
    for (const { name } of RECURRING_TASKS.filter((t) => t.tenants !== "platform")) {
      const [first, second] = await Promise.all([tick(name), tick(name)]);
      expect(second).toEqual(first);
      jobs += first.published;
    }
    await module.queue.drain();
    for (const { name } of RECURRING_TASKS) await tick(name); // a retried cron, later
    await module.queue.drain();

    expect(jobs).toBe(1 + 5 * all.length);
    const count = (outcome: string) => outcomes.filter((o) => o === outcome).length;
    // Every per-tenant job twice at once and all once more; the platform job once, then once more.
    expect({ success: count("success"), duplicate: count("duplicate"), all: outcomes.length }).toEqual({
      success: jobs,
      duplicate: 2 * jobs - 1,
      all: 3 * jobs - 1,
    });
    const [effects] = await pg.sql<Record<string, number>[]>`
      select (select count(*)::int from core.processed_jobs where consumer = 'loyalty.recurring') as fences,
             (select count(*)::int from loyalty.consumption_snapshots where credits = 1) as snapshots,
             (select count(distinct tenant_id)::int from loyalty.consumption_snapshots) as snapshot_tenants,
             (select count(*)::int from loyalty.tenant_stats) as stats,
             (select count(*)::int from loyalty.reconciliations where discrepancies = 0) as reconciliations,
             (select count(*)::int from loyalty.points_expiring_soon where points = 10) as expiring,
             (select count(*)::int from loyalty.ledger_rollups where points = 3 and credits = 1) as rollups,
             (select count(*)::int from loyalty.ledger) as ledger`;
    expect(effects).toEqual({
      fences: jobs,
      snapshots: all.length,
      snapshot_tenants: all.length,
      stats: all.length,
      reconciliations: all.length,
      expiring: all.length,
      rollups: 3,
      ledger: all.length,
    });
  });
});
