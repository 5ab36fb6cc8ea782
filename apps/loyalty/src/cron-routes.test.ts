/**
 * #20 item 3: the Vercel Cron side of the recurring tasks — one route per
 * task, refusing anything but Vercel's bearer token and auditing every call,
 * fanning out the tick the call falls in (so a retried cron applies nothing
 * twice) — and vercel.json's crons, which fire once per tick, after it.
 */
import { createManualClock } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { createLoyaltyModule, type InProcessLoyaltyModule } from "./composition-root.ts";
import { CRON_OFFSET_MINUTES, cronPath, cronSchedule, loyaltyCronRoutes, loyaltyCrons } from "./cron-routes.ts";
import { RECURRING_TASKS } from "./recurring.ts";
import { upsertTenant } from "./tenants.ts";

const pg = useModuleDatabase("loyalty-cron-routes");
const SECRET = "loyalty-cron-secret-0123456789";
let module: InProcessLoyaltyModule;

beforeAll(async () => {
  module = await createLoyaltyModule({
    databaseUrl: pg.url,
    transport: "memory",
    notifier: { pointsAwarded: async () => {} },
    logger: { warn: () => {}, error: () => {} },
    clock: createManualClock(Date.now()),
  });
});
afterAll(async () => {
  await module?.close();
});

const MIDNIGHT = Date.parse("2026-12-02T00:00:00.000Z");

describe("the cron routes", () => {
  test("one per task; a call without Vercel's bearer token is refused and audited, and publishes nothing", async () => {
    let now = MIDNIGHT + CRON_OFFSET_MINUTES * 60_000;
    const routes = loyaltyCronRoutes(module, { secret: SECRET, clock: { now: () => now } });
    expect(Object.keys(routes)).toEqual(RECURRING_TASKS.map((t) => t.name));
    for (const id of ["acme", "globex"]) await upsertTenant(pg.db, id, "1h");
    const call = (name: string, authorization?: string) =>
      (routes[name] as (r: Request) => Promise<Response>)(
        new Request(`https://loyalty.invalid${cronPath(name)}`, authorization ? { headers: { authorization } } : {}),
      );

    for (const wrong of [undefined, `Bearer ${SECRET}x`, SECRET, "Bearer "]) {
      expect((await call("loyalty.consumption-snapshot", wrong)).status).toBe(401);
    }
    expect(module.queue.pending()).toBe(0);

    // The partitions first, so the snapshots' month has its partition whenever this runs.
    expect((await call("loyalty.partitions", `Bearer ${SECRET}`)).status).toBe(200);
    const ok = await call("loyalty.consumption-snapshot", `Bearer ${SECRET}`);
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ tick: "2026-12-02T00:00:00.000Z", tenants: 2, published: 2 });
    now += 20 * 60_000; // Vercel calls again within the same tick: the same jobs
    expect(await (await call("loyalty.consumption-snapshot", `Bearer ${SECRET}`)).json()).toMatchObject({
      tick: "2026-12-02T00:00:00.000Z",
      published: 2,
    });
    await module.queue.drain();
    const snapshots = await pg.sql`select tenant_id from loyalty.consumption_snapshots order by 1`;
    expect(snapshots.map((r) => r["tenant_id"])).toEqual(["acme", "globex"]);

    const audit = await pg.sql<{ action: string; result: string }[]>`
      select action, result from core.ops_audit where operator = 'cron' order by id`;
    expect(audit).toEqual([
      ...Array(4).fill({ action: "fanout.loyalty.consumption-snapshot", result: "refused" }),
      { action: "fanout.loyalty.partitions", result: "ok" },
      { action: "fanout.loyalty.consumption-snapshot", result: "ok" },
      { action: "fanout.loyalty.consumption-snapshot", result: "ok" },
    ]);
  });

  test("the routes are not made without a CRON_SECRET of at least 16 characters", () => {
    expect(() => loyaltyCronRoutes(module, { env: {} })).toThrow(/CRON_SECRET/);
    expect(() => loyaltyCronRoutes(module, { secret: "short" })).toThrow(/CRON_SECRET/);
  });
});

/** The UTC minutes of one day a five-field cron expression of the forms cronSchedule writes fires at. */
function firesOn(expression: string): number[] {
  const [minute, hour, ...rest] = expression.split(" ");
  expect(rest).toEqual(["*", "*", "*"]);
  const matches = (field: string, value: number) =>
    field === "*" ||
    (field.startsWith("*/") ? value % Number(field.slice(2)) === 0 : field.split(",").map(Number).includes(value));
  const fires: number[] = [];
  for (let m = 0; m < 1_440; m++) {
    if (matches(hour as string, Math.floor(m / 60)) && matches(minute as string, m % 60)) fires.push(m);
  }
  return fires;
}

describe("vercel.json crons", () => {
  test("one per task, at its route's path, firing once per tick CRON_OFFSET_MINUTES after it", () => {
    expect(loyaltyCrons()).toEqual(
      RECURRING_TASKS.map((t) => ({
        path: `/api/cron/${t.name.replace("loyalty.", "loyalty-")}`,
        schedule: expect.any(String),
      })),
    );
    for (const [i, { schedule }] of loyaltyCrons().entries()) {
      const periodMinutes = (RECURRING_TASKS[i]?.everyMs as number) / 60_000;
      const fires = firesOn(schedule);
      const ticks = Array.from({ length: 1_440 / periodMinutes }, (_, k) => k * periodMinutes);
      expect(fires).toEqual(ticks.map((t) => t + CRON_OFFSET_MINUTES));
    }
    expect([30, 60, 180, 720, 1_440].map((m) => cronSchedule(m * 60_000))).toEqual([
      "5,35 * * * *",
      "5 * * * *",
      "5 */3 * * *",
      "5 */12 * * *",
      "5 0 * * *",
    ]);
    expect(() => cronSchedule(7 * 60_000)).toThrow(/no cron expression/);
    expect(() => cronSchedule(5 * 60_000)).toThrow(/no cron expression/);
  });
});
