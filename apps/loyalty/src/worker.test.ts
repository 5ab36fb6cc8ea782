import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { createEnvelope } from "@softcrum/core";
import { toVercelTopic } from "@softcrum/core/adapters/vercel";
import { runScript, startScript, useTestDatabase } from "@softcrum/testing";
import { beforeEach, describe, expect, test } from "vitest";
import { startFakeVercelQueues } from "../../../packages/core/test/fake-vercel-queues.ts";
import { AWARD_POINTS_QUEUE } from "./award-points.ts";
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

  test("with Vercel Queues it refuses to start without the fixed region it polls (#11 item 3)", async () => {
    const saved = process.env["SOFTCRUM_QUEUE_REGION"];
    delete process.env["SOFTCRUM_QUEUE_REGION"];
    try {
      await expect(
        startLoyaltyWorker({
          databaseUrl: pg.url,
          notifier: { pointsAwarded: async () => {} },
          transport: "vercel",
          vercel: { token: "t", env: { VERCEL_REGION: "iad1" } },
          fenceTtlMs: 8 * DAY,
          cleanupEveryMs: 60_000,
        }),
      ).rejects.toThrow(/set SOFTCRUM_QUEUE_REGION/);
    } finally {
      if (saved !== undefined) process.env["SOFTCRUM_QUEUE_REGION"] = saved;
    }
  });

  test("with Vercel Queues it polls its topics unpinned in its fixed region, from the oldest message (#11 items 3, 6)", async () => {
    const fake = await startFakeVercelQueues({ deployments: "strict", cursorDefault: "latest" });
    const job = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "c-poll", points: 5, reason: "purchase" },
    });
    // Sent before the worker's consumer group exists, unpinned, to the region it polls.
    fake.inject(toVercelTopic(AWARD_POINTS_QUEUE), JSON.stringify(job), { region: "fra1" });
    const worker = await startLoyaltyWorker({
      databaseUrl: pg.url,
      notifier: { pointsAwarded: async () => {} },
      transport: "vercel",
      vercel: { ...fake.clientOptions("fra1"), env: {} },
      fenceTtlMs: 8 * DAY,
      cleanupEveryMs: 60_000,
    });
    try {
      const credited = async () =>
        (await pg.sql<{ n: number }[]>`select count(*)::int as n from loyalty.ledger where job_id = ${job.job_id}`)[0]
          ?.n;
      const until = Date.now() + 20_000;
      while ((await credited()) !== 1 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      expect(await credited()).toBe(1);
      expect(fake.receives.every((r) => r.region === "fra1" && r.deploymentId === null)).toBe(true);
    } finally {
      await worker.stop();
      await fake.close();
    }
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

describe("pnpm worker", () => {
  test("on the embedded database it keeps running until told to stop, and SIGTERM stops it cleanly with exit code 0 (#9 item 6)", async () => {
    // No DATABASE_URL: the embedded PGlite, which holds no socket open.
    const { DATABASE_URL, SOFTCRUM_QUEUE, BETTERSTACK_SOURCE_TOKEN, ...env } = process.env;
    const worker = startScript(fileURLToPath(new URL("./worker.ts", import.meta.url)), [], { env });
    const { child } = worker;
    const exited = once(child, "exit") as Promise<[number | null, NodeJS.Signals | null]>;
    let exitedEarly = false;
    void exited.then(() => {
      exitedEarly = true;
    });
    try {
      await new Promise<void>((resolve, reject) => {
        const onData = () => {
          if (worker.stdout().includes("loyalty worker running on pglite")) resolve();
        };
        child.stdout?.on("data", onData);
        void exited.then(([code]) =>
          reject(new Error(`worker exited (${code}) before it ran: ${worker.stdout()}${worker.stderr()}`)),
        );
      });
      // Nothing is left for it to do. A worker that lives only while something
      // else holds the event loop has ended well before this: the last thing
      // that does is PGlite's own 10 s interval timer, armed by its last
      // statement before "running" (the process then exits with code 0).
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 15_000))]);
      expect(exitedEarly, `the worker exited by itself: ${worker.stdout()}${worker.stderr()}`).toBe(false);

      child.kill("SIGTERM");
      const [code, signal] = await exited;
      expect({ code, signal }, worker.stderr()).toEqual({ code: 0, signal: null });
      expect(worker.stdout()).toMatch(/SIGTERM, stopping\n.*stopped/s);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    }
  });
});
