/**
 * #20 item 3: the worker runs a schedule loop per recurring task and stops
 * them with itself. The loops' clock is set just before a midnight, where
 * every task's period has a boundary: each loop fans out that tick once, the
 * jobs apply once per tenant, and a cron route called in the same tick
 * afterwards adds nothing.
 */
import type { FanOutReport } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { describe, expect, test } from "vitest";
import { loyaltyCronRoutes } from "./cron-routes.ts";
import { RECURRING_TASKS } from "./recurring.ts";
import { startLoyaltyWorker } from "./worker.ts";

const pg = useModuleDatabase("loyalty-worker-recurring");
const DAY = 86_400_000;

describe("the worker's recurring loops", () => {
  test("one per task: each fans out the boundary's tick once, its jobs apply once per tenant; stopping the worker stops them", async () => {
    await pg.sql`
      insert into loyalty.tenants (tenant_id, tier)
      values ('acme', 'nightly'), ('globex', '1h'), ('initech', '6h')`;
    // The last midnight (UTC): this month's snapshot partition exists (the migration made it).
    const midnight = Math.floor(Date.now() / DAY) * DAY;
    const shift = midnight - 1_000 - Date.now();
    const reports: { task: string; report: FanOutReport }[] = [];
    let allRan: () => void = () => {};
    const ran = new Promise<void>((resolve) => {
      allRan = resolve;
    });
    const worker = await startLoyaltyWorker({
      databaseUrl: pg.url,
      notifier: { pointsAwarded: async () => {} },
      transport: "memory",
      fenceTtlMs: 8 * DAY,
      cleanupEveryMs: 3_600_000,
      recurring: {
        now: () => Date.now() + shift,
        onRun: (task, report) => {
          reports.push({ task, report });
          if (reports.length === RECURRING_TASKS.length) allRan();
        },
      },
    });
    let stopped = false;
    try {
      const { module } = worker;
      if (module.transport !== "memory") throw new Error("expected the in-process queue");
      await ran;
      await module.queue.drain();
      const tick = new Date(midnight).toISOString();
      expect(reports.map(({ task, report }) => [task, report.tick, report.tenants, report.published]).sort()).toEqual(
        RECURRING_TASKS.map((t) => [
          t.name,
          tick,
          t.tenants === "platform" ? 1 : 3,
          t.tenants === "platform" ? 1 : 3,
        ]).sort(),
      );

      // A Vercel Cron of the same task in the same tick publishes the same jobs: nothing more applies.
      const routes = loyaltyCronRoutes(module, { secret: "s".repeat(16), clock: { now: () => midnight + 300_000 } });
      const snapshot = routes["loyalty.consumption-snapshot"] as (request: Request) => Promise<Response>;
      const response = await snapshot(
        new Request("https://loyalty.invalid/api/cron/x", { headers: { authorization: `Bearer ${"s".repeat(16)}` } }),
      );
      expect(await response.json()).toMatchObject({ tick, published: 3 });
      await module.queue.drain();

      const [effects] = await pg.sql<Record<string, number>[]>`
        select (select count(*)::int from core.processed_jobs where consumer = 'loyalty.recurring') as fences,
               (select count(*)::int from loyalty.consumption_snapshots) as snapshots,
               (select count(*)::int from loyalty.tenant_stats) as stats,
               (select count(*)::int from loyalty.reconciliations) as reconciliations`;
      expect(effects).toEqual({ fences: 5 * 3 + 1, snapshots: 3, stats: 3, reconciliations: 3 });

      await worker.stop();
      stopped = true;
      // stop() waited for every loop to end: none can run again.
      expect(reports).toHaveLength(RECURRING_TASKS.length);
    } finally {
      if (!stopped) await worker.stop();
    }
  });
});
