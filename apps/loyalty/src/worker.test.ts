import { fileURLToPath } from "node:url";
import { runScript, useTestDatabase } from "@softcrum/testing";
import { beforeEach, describe, expect, test } from "vitest";
import { startLoyaltyWorker } from "./worker.ts";

const pg = useTestDatabase("loyalty-worker");
const DAY = 86_400_000;

beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters cascade`;
});

async function expiredFences(count: number) {
  await pg.sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'loyalty.award-points', now() - interval '10 days' from generate_series(1, ${count})`;
}
const fenceCount = async () =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`)[0]?.n;

const cleanupCommand = (args: string[]) =>
  runScript(fileURLToPath(new URL("./cleanup-cli.ts", import.meta.url)), args, { env: { DATABASE_URL: pg.url } });

describe("the loyalty worker's maintenance", () => {
  test("runs the fence cleanup on its schedule", async () => {
    await expiredFences(25);
    const reports: number[] = [];
    const worker = await startLoyaltyWorker({
      databaseUrl: pg.url,
      notifier: { pointsAwarded: async () => {} },
      transport: "memory",
      fenceTtlMs: 7 * DAY,
      cleanupEveryMs: 40,
      onCleanup: (r) => reports.push(r.deleted),
    });
    try {
      while (reports.reduce((a, b) => a + b, 0) < 25) await new Promise((r) => setTimeout(r, 10));
      await expiredFences(5);
      while (reports.reduce((a, b) => a + b, 0) < 30) await new Promise((r) => setTimeout(r, 10));
      expect(await fenceCount()).toBe(0);
    } finally {
      await worker.stop();
    }
  });

  test("refuses to start with a TTL a late retry could outlive", async () => {
    await expect(
      startLoyaltyWorker({
        databaseUrl: pg.url,
        notifier: { pointsAwarded: async () => {} },
        fenceTtlMs: 60_000,
        cleanupEveryMs: 1000,
      }),
    ).rejects.toThrow(/too short for consumer "loyalty\.award-points"/);
  });

  test("the one-shot command reports in a dry run, then deletes", async () => {
    await expiredFences(7);
    const dry = await cleanupCommand(["--dry-run"]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toMatch(/dry run: would delete 7 fence rows older than 192 h/);
    expect(await fenceCount()).toBe(7);
    const real = await cleanupCommand([]);
    expect(real.code, real.stderr).toBe(0);
    expect(real.stdout).toMatch(/deleted 7 fence rows/);
    expect(await fenceCount()).toBe(0);
    const bad = await cleanupCommand(["--now"]);
    expect(bad.code).toBe(2);
  });

  test("a dry run reads at most --max-batches pages and says its figures are a lower bound (#9 item 12)", async () => {
    await expiredFences(10_001);
    const dry = await cleanupCommand(["--dry-run", "--max-batches", "1"]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toMatch(/dry run: would delete at least 5000 fence rows older than 192 h/);
    expect(dry.stdout).toMatch(/read the first 5000 expired rows only, in 1 page:/);
    const whole = await cleanupCommand(["--dry-run", "--max-batches", "3"]);
    expect(whole.stdout).toMatch(/dry run: would delete 10001 fence rows/);
    expect(await fenceCount()).toBe(10_001);
    expect((await cleanupCommand(["--max-batches", "1"])).code).toBe(2);
  });
});
