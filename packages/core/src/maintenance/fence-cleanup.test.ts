import { uuidv7 } from "uuidv7";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effectConsumer, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import { createFenceCleanup, scheduleFenceCleanup } from "./fence-cleanup.ts";

const pg = useEffectsDatabase("fence-cleanup");
const HOUR = 3_600_000;
const consumer = effectConsumer("cleanup.award"); // default policy: retries span 7.5 minutes

/** Fence rows processed `ageMs` ago (database time). */
async function fences(count: number, ageMs: number, consumerName = "cleanup.award"): Promise<string[]> {
  const ids = Array.from({ length: count }, () => uuidv7());
  await pg.sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select unnest(${ids}::uuid[]), ${consumerName}, now() - make_interval(secs => ${ageMs / 1000})`;
  return ids;
}
async function deadLetter(jobId: string, status: "pending_review" | "replayed" | "discarded") {
  await pg.sql`
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                   status_changed_at, status_changed_by, status_reason)
    values (${uuidv7()}, ${jobId}, 'q', 'other.consumer', '{}', 5, 'e', 'exhausted', ${status},
            ${status === "pending_review" ? null : new Date().toISOString()}::timestamptz, ${status === "pending_review" ? null : "ops"}, 'r')`;
}
const remaining = async () =>
  (await pg.sql<{ job_id: string }[]>`select job_id from core.processed_jobs`).map((r) => r.job_id);

describe("fence TTL cleanup", () => {
  test("deletes expired rows, keeps rows inside the TTL and rows whose job has a pending dead letter", async () => {
    const expired = await fences(5, 25 * HOUR);
    const fresh = await fences(3, 10 * 60_000);
    const [protectedJob, replayedJob] = await fences(2, 30 * HOUR);
    await deadLetter(protectedJob as string, "pending_review");
    await deadLetter(replayedJob as string, "replayed");

    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer], batchSize: 2 });
    const dry = await cleanup.run({ dryRun: true });
    expect(dry).toMatchObject({ deleted: 6, keptForPendingDeadLetters: 1, dryRun: true });
    expect(await remaining()).toHaveLength(10);

    const report = await cleanup.run();
    expect(report).toMatchObject({ deleted: 6, keptForPendingDeadLetters: 1, dryRun: false });
    expect(report.batches).toBe(4); // 2 + 2 + 2 + an empty one that ends the run
    expect(new Set(await remaining())).toEqual(new Set([...fresh, protectedJob]));
    for (const id of expired) expect(await remaining()).not.toContain(id);
  });

  test("never deletes a row inside its retry window, even with the shortest TTL allowed", async () => {
    const policy = { maxAttempts: 3, baseDelayMs: 1000, maxDelayMs: 2000 }; // retries span 3 s
    const fast = defineConsumer({
      name: "fast",
      queue: "q",
      kind: "k.v1",
      schema: z.object({}),
      retry: policy,
      handle: async () => {},
    });
    // The shortest TTL allowed is 2 × 3 s; one millisecond less is refused.
    expect(() => createFenceCleanup({ db: pg.db, ttlMs: 5999, consumers: [fast] })).toThrow(InvalidConfigError);
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 6000, consumers: [fast] });
    const insideRetryWindow = await fences(4, 2900, "fast");
    const insideTtl = await fences(4, 5500, "fast");
    const expired = await fences(4, 7000, "fast");
    expect((await cleanup.run()).deleted).toBe(4);
    expect(new Set(await remaining())).toEqual(new Set([...insideRetryWindow, ...insideTtl]));
    expect(expired.some((id) => insideRetryWindow.includes(id))).toBe(false);
  });

  test("deletes only the fences of the consumers it was given (their windows are the ones checked)", async () => {
    const mine = await fences(3, 48 * HOUR);
    const othersModule = await fences(3, 48 * HOUR, "billing.charge");
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer] });
    expect((await cleanup.run()).deleted).toBe(3);
    expect(new Set(await remaining())).toEqual(new Set(othersModule));
    expect(mine.some((id) => othersModule.includes(id))).toBe(false);
  });

  test("a transport that may hold a message longer (a Vercel deferral) raises the minimum TTL", () => {
    const day = 24 * HOUR;
    expect(() =>
      createFenceCleanup({ db: pg.db, ttlMs: 5 * day, consumers: [consumer], transportHoldMs: 6 * day }),
    ).toThrow(/at least 2 × 450000 \+ 518400000 \(transport hold\) = 519300000 ms/);
    expect(() =>
      createFenceCleanup({ db: pg.db, ttlMs: 7 * day, consumers: [consumer], transportHoldMs: 6 * day }),
    ).not.toThrow();
  });

  test("a TTL a late retry could outlive is refused at start, naming the consumer and the numbers", () => {
    const slow = defineConsumer({
      name: "loyalty.slow",
      queue: "q",
      kind: "k.v1",
      schema: z.object({}),
      retry: { maxAttempts: 8, baseDelayMs: 10_000, maxDelayMs: 3_600_000 },
      handle: async () => {},
    });
    let error: unknown;
    try {
      createFenceCleanup({ db: pg.db, ttlMs: 30 * 60_000, consumers: [consumer, slow] });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidConfigError);
    expect((error as Error).message).toMatch(/too short for consumer "loyalty\.slow": its retries can span 1270000 ms/);
    expect((error as Error).message).toMatch(/at least 2 × 1270000 = 2540000 ms/);
    expect(() => createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [] })).toThrow(/name the consumers/);
  });

  test("100,000 expired rows go while consumers keep inserting fences, and none of their transactions fail", async () => {
    await pg.sql`
      insert into core.processed_jobs (job_id, consumer, processed_at)
      select gen_random_uuid(), 'cleanup.award', now() - interval '2 days' from generate_series(1, 100000)`;
    const cleanup = createFenceCleanup({
      db: pg.connect({ max: 1 }).db,
      ttlMs: 24 * HOUR,
      consumers: [consumer],
      batchSize: 2000,
    });
    const bound = bindConsumer(consumer, { db: pg.connect({ max: 8 }).db, logger: silentLogger });

    let stop = false;
    const outcomes: string[] = [];
    const live = Promise.all(
      Array.from({ length: 8 }, async () => {
        while (!stop) {
          const e = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 1 } });
          outcomes.push((await bound.deliver({ body: JSON.stringify(e), deliveryCount: 1 })).outcome);
        }
      }),
    );
    const report = await cleanup.run();
    stop = true;
    await live;

    expect(report.deleted).toBe(100_000);
    expect(report.batches).toBeGreaterThanOrEqual(50);
    expect(outcomes.length).toBeGreaterThan(0);
    expect(new Set(outcomes)).toEqual(new Set(["success"]));
    const [row] = await pg.sql<{ fences: number; effects: number }[]>`
      select (select count(*)::int from core.processed_jobs) as fences, (select count(*)::int from test_effects) as effects`;
    expect(row).toEqual({ fences: outcomes.length, effects: outcomes.length }); // every live fence survived
  });

  test("on a schedule, it runs again and again until stopped", async () => {
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer] });
    const runs: number[] = [];
    const schedule = scheduleFenceCleanup(cleanup, { intervalMs: 30, onRun: (r) => runs.push(r.deleted) });
    await fences(3, 48 * HOUR);
    while (runs.reduce((a, b) => a + b, 0) < 3) await new Promise((r) => setTimeout(r, 10));
    await fences(2, 48 * HOUR);
    while (runs.reduce((a, b) => a + b, 0) < 5) await new Promise((r) => setTimeout(r, 10));
    await schedule.stop();
    const after = runs.length;
    await new Promise((r) => setTimeout(r, 100));
    expect(runs.length).toBe(after);
    expect(await remaining()).toHaveLength(0);
  });
});
