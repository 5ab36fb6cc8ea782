/**
 * Two maintenance runs at once, and the days a caller may name (ADR 0014).
 * Two processes run the scheduled cleanup at the same time (two modules, or
 * two replicas of one worker): neither fails nor deadlocks the other, and
 * live fences keep landing. Each case failed before its fix (a second
 * reader's probes, 2026-12-04).
 */
import { uuidv7 } from "uuidv7";
import { beforeEach, describe, expect, test } from "vitest";
import { awayFromDayEdges, dbDay, fencePartitions, insertFences, jobsOf, waitUntil } from "../../test/fence-days.ts";
import { effectConsumer, useEffectsDatabase } from "../../test/fixtures.ts";
import { InvalidConfigError } from "../errors.ts";
import { createFenceCleanup } from "./fence-cleanup.ts";
import { ensureFencePartitions } from "./fence-partitions.ts";

const pg = useEffectsDatabase("fence-maintenance-runs");
const DAY = 86_400_000;
const compact = (day: string) => day.replaceAll("-", "");
const settled = (run: Promise<unknown>) =>
  run.then(
    (report) => ({ ok: true as const, report }),
    (error: unknown) => ({ ok: false as const, error: String((error as Error)?.cause ?? error) }),
  );
/** A session waiting on a lock, running a statement that contains `text`. */
const waitingOn = (text: string) =>
  pg.sql`select 1 from pg_stat_activity
    where datname = current_database() and wait_event_type = 'Lock' and query like ${`%${text}%`}`;

beforeEach(async () => {
  await awayFromDayEdges(pg.sql);
  const today = await dbDay(pg.sql, 0);
  for (const day of [...(await fencePartitions(pg.sql)), ...(await fencePartitions(pg.sql, true))]) {
    if (day <= today) await pg.sql.unsafe(`drop table core.processed_jobs_p${compact(day)}`);
  }
});

/** A live work transaction holding the fence table: every detach queues behind it until `commit()`. */
async function inFlightFence() {
  const conn = await pg.sql.reserve();
  await conn`begin`;
  await conn`insert into core.processed_jobs (job_id, consumer) values (${uuidv7()}, 'in.flight')`;
  return {
    async commit() {
      await conn`commit`;
      conn.release();
    },
  };
}

describe("two cleanup runs at once", () => {
  test("both detach the same expired day, queued behind a live transaction: one drops it, the other finds it gone; neither fails", async () => {
    const day = await dbDay(pg.sql, -10);
    const consumer = effectConsumer("runs.same-day");
    await ensureFencePartitions({ db: pg.db, days: { first: day, last: day } });
    await insertFences(pg.sql, jobsOf(day, 3), consumer.name, 9 * DAY);
    const live = await inFlightFence();
    const cleanup = () =>
      createFenceCleanup({
        db: pg.connect({ max: 1 }).db,
        ttlMs: DAY,
        consumers: [consumer],
        partitionLockTimeoutMs: 20_000,
      });
    const runs = [settled(cleanup().run()), settled(cleanup().run())];
    try {
      // One run's detach waits on the fence table; the other waits too (on
      // the same table before the fix, on the day's advisory lock since).
      await waitUntil(async () => {
        const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock'`;
        return (row?.n ?? 0) >= 2 ? [row] : [];
      }, "both runs waiting");
    } finally {
      await live.commit();
    }
    const results = await Promise.all(runs);
    expect(results.map((r) => r.ok)).toEqual([true, true]);
    const dropped = results.map((r) => (r.ok ? (r.report as { partitionsDropped: number }).partitionsDropped : -1));
    expect(dropped.sort()).toEqual([0, 1]);
    expect(await fencePartitions(pg.sql)).not.toContain(day);
    expect(await fencePartitions(pg.sql, true)).not.toContain(day);
  });

  test("one run's batches over the default partition and another run's detach never deadlock, with lock waits longer than the deadlock check", async () => {
    const x = effectConsumer("runs.pages");
    const y = effectConsumer("runs.detach");
    const day = await dbDay(pg.sql, -10);
    await ensureFencePartitions({ db: pg.db, days: { first: day, last: day } });
    // Run A keeps the day (it holds y's fences, not A's) and pages it with the default partition's rows.
    await insertFences(pg.sql, jobsOf(day, 3), y.name, 9 * DAY);
    await insertFences(pg.sql, jobsOf(await dbDay(pg.sql, -30), 40), x.name, 30 * DAY);
    const pages = createFenceCleanup({
      db: pg.connect({ max: 1 }).db,
      ttlMs: DAY,
      consumers: [x],
      batchSize: 1,
      pauseBetweenBatchesMs: 150,
    });
    const detach = createFenceCleanup({
      db: pg.connect({ max: 1 }).db,
      ttlMs: DAY,
      consumers: [y],
      partitionLockTimeoutMs: 5_000,
    });
    const runA = settled(pages.run());
    await waitUntil(() => pg.sql`select 1 from core.processed_jobs_default having count(*) <= 38`, "A paging");
    const live = await inFlightFence();
    const runB = settled(detach.run());
    try {
      await waitUntil(() => waitingOn("fence_partition_detach"), "B's detach queued on the fence table");
      await waitUntil(() => waitingOn("part0 as"), "A's next page queued");
    } finally {
      await live.commit();
    }
    const [a, b] = await Promise.all([runA, runB]);
    expect(a).toMatchObject({ ok: true });
    expect(b).toMatchObject({ ok: true });
    expect(await pg.sql`select 1 from core.processed_jobs where consumer = ${x.name}`).toHaveLength(0);
    expect(await fencePartitions(pg.sql)).not.toContain(day);
  });
});

describe("the days ensureFencePartitions is given", () => {
  test.each([
    [{ first: "2024-02-30", last: "2024-02-30" }, "not a calendar day"],
    [{ first: "1969-12-31", last: "1969-12-31" }, "before 1970"],
    [{ first: "2020-01-01", last: "2022-01-01" }, "more than"],
    [{ first: "2024-01-10", last: "2024-01-01" }, "after"],
  ])("%o is refused with a typed error that says why (%s), and nothing is created", async (days, why) => {
    const before = await fencePartitions(pg.sql);
    const error = await ensureFencePartitions({ db: pg.db, days }).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    expect(error).toBeInstanceOf(InvalidConfigError);
    expect(String((error as Error).message)).toContain(why);
    expect(await fencePartitions(pg.sql)).toEqual(before);
    const [checks] = await pg.sql<{ n: number }[]>`select count(*)::int as n from pg_constraint
      where conrelid = 'core.processed_jobs_default'::regclass and contype = 'c'`;
    expect(checks?.n).toBe(0);
  });
});
