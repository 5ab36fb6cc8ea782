/**
 * The fence's day partitions (#23 item 4, ADR 0014) on real Postgres: created
 * ahead by several processes at once while live fences keep landing, dropped
 * once their whole day is past the TTL with every fence the cleanup keeps
 * moved into the default partition in the detach's own transaction, so a
 * copy of such a job is still a duplicate — also one whose fence insert
 * raced the detach.
 */
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { beforeEach, describe, expect, test } from "vitest";
import {
  awayFromDayEdges,
  dbDay,
  fenceHome,
  fencePartitions,
  insertFences,
  jobsOf,
  waitUntil,
} from "../../test/fence-days.ts";
import { effectConsumer, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { recordingClient } from "../../test/recording-client.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { createFenceCleanup } from "./fence-cleanup.ts";
import { ensureFencePartitions } from "./fence-partitions.ts";

const pg = useEffectsDatabase("fence-partitions");
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const TTL = DAY;
const consumer = effectConsumer("partitions.award");
const compact = (day: string) => day.replaceAll("-", "");

/** A dead letter of `jobId` (another consumer's); a replayed or discarded one changed status `changedAgoMs` ago. */
async function deadLetter(jobId: string, status: "pending_review" | "replayed" | "discarded", changedAgoMs = 0) {
  const changed = status !== "pending_review";
  await pg.sql`
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                   status_changed_at, status_changed_by, status_reason)
    values (${uuidv7()}, ${jobId}, 'q', 'other.consumer', '{}', 5, 'e', 'exhausted', ${status},
            case when ${changed} then now() - make_interval(secs => ${changedAgoMs / 1000}) end,
            ${changed ? "ops" : null}, 'r')`;
}

/** The fence statement's shape (ON CONFLICT DO NOTHING): one row when it wrote a new fence, none for a duplicate. */
const fenceInsert = (sql: typeof pg.sql, jobId: string, name = consumer.name) =>
  sql`insert into core.processed_jobs (job_id, consumer, processed_at) values (${jobId}, ${name}, clock_timestamp())
      on conflict do nothing returning 1`;

const deliverCopy = (jobId: string, db = pg.db) =>
  bindConsumer(consumer, { db, logger: silentLogger }).deliver({
    body: JSON.stringify(
      createEnvelope({ jobId, tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 1 } }),
    ),
    deliveryCount: 2,
  });

/** A day ten days ago with its own partition (TTL 24 h: its whole day is long past). */
async function pastDay(): Promise<string> {
  const day = await dbDay(pg.sql, -10);
  const report = await ensureFencePartitions({ db: pg.db, days: { first: day, last: day } });
  expect(report).toMatchObject({ created: 1, complete: true });
  return day;
}

/** How long ago, in ms, the consumer's fence horizon is (`core.fence_horizons`); undefined with none. */
async function horizonAge(): Promise<number | undefined> {
  const [row] = await pg.sql<{ ms: number }[]>`
    select (extract(epoch from now() - cleaned_before) * 1000)::float8 as ms from core.fence_horizons where consumer = ${consumer.name}`;
  return row?.ms;
}

beforeEach(async () => {
  await awayFromDayEdges(pg.sql);
  // Each test starts with no partition of a past day (the template's are all ahead).
  const today = await dbDay(pg.sql, 0);
  for (const day of [...(await fencePartitions(pg.sql)), ...(await fencePartitions(pg.sql, true))]) {
    if (day <= today) await pg.sql.unsafe(`drop table core.processed_jobs_p${compact(day)}`);
  }
});

describe("day partitions created ahead (#23 item 4)", () => {
  test("pre-creation from four processes at once creates each day once, while live fences keep landing; again it is a no-op", async () => {
    for (const day of await fencePartitions(pg.sql))
      await pg.sql.unsafe(`drop table core.processed_jobs_p${compact(day)}`);
    const [range] = await pg.sql<{ first: string; last: string }[]>`
      select to_char(((now() + interval '1 hour') at time zone 'UTC')::date + 1, 'YYYY-MM-DD') as first,
             to_char((now() at time zone 'UTC')::date + 10, 'YYYY-MM-DD') as last`;
    const expected: string[] = [];
    for (let t = Date.parse(`${range?.first}T00:00:00Z`); t <= Date.parse(`${range?.last}T00:00:00Z`); t += DAY) {
      expected.push(new Date(t).toISOString().slice(0, 10));
    }
    expect(expected.length).toBeGreaterThanOrEqual(9);

    let stop = false;
    const written: string[] = [];
    const failures: unknown[] = [];
    const writer = pg.connect({ max: 1 }).sql;
    const live = (async () => {
      while (!stop) {
        const id = uuidv7();
        try {
          if ((await fenceInsert(writer, id, "live")).length === 1) written.push(id);
        } catch (error) {
          failures.push(error);
        }
      }
    })();
    const reports = await Promise.all(
      Array.from({ length: 4 }, () => ensureFencePartitions({ db: pg.connect({ max: 1 }).db, daysAhead: 10 })),
    );
    stop = true;
    await live;

    expect(reports.map((r) => r.complete)).toEqual([true, true, true, true]);
    expect(reports.reduce((sum, r) => sum + r.created, 0)).toBe(expected.length);
    expect(await fencePartitions(pg.sql)).toEqual(expected);
    const left = await pg.sql`select conname from pg_constraint where conname like 'processed_jobs_default_ahead_%'`;
    expect(left).toEqual([]);
    expect(failures).toEqual([]);
    expect(written.length).toBeGreaterThan(0);
    const [stored] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.processed_jobs_default where consumer = 'live'`;
    expect(stored?.n).toBe(written.length);

    expect(await ensureFencePartitions({ db: pg.db, daysAhead: 10 })).toMatchObject({ created: 0, complete: true });
    // Bounds: the smallest UUID of each UTC midnight (its milliseconds, then zeros).
    const [bound] = await pg.sql<{ bound: string }[]>`
      select pg_get_expr(c.relpartbound, c.oid) as bound from pg_class c
      where c.relname = ${`processed_jobs_p${compact(expected[0] as string)}`}`;
    const hex = Date.parse(`${expected[0]}T00:00:00Z`).toString(16).padStart(12, "0");
    expect(bound?.bound).toContain(`FROM ('${hex.slice(0, 8)}-${hex.slice(8)}-0000-0000-000000000000')`);
  });

  test("a day whose fences already are in the default partition gets no partition; the days around it do", async () => {
    for (const day of await fencePartitions(pg.sql))
      await pg.sql.unsafe(`drop table core.processed_jobs_p${compact(day)}`);
    const early = await dbDay(pg.sql, 4); // a fence from a producer's clock four days ahead
    const [stray] = jobsOf(early, 1);
    await insertFences(pg.sql, [stray as string], consumer.name, 0);
    const report = await ensureFencePartitions({ db: pg.db, daysAhead: 7 });
    expect(report.complete).toBe(true);
    const days = await fencePartitions(pg.sql);
    expect(days).not.toContain(early);
    expect(days).toContain(await dbDay(pg.sql, 5));
    expect(days).toContain(await dbDay(pg.sql, 7));
    expect(await fenceHome(pg.sql, stray as string, consumer.name)).toBe("processed_jobs_default");
    expect(await fenceInsert(pg.sql, stray as string)).toHaveLength(0);
  });
});

describe("a day past the TTL goes with its partition (#23 item 4)", () => {
  test("the fences the cleanup keeps move to the default partition and still make every copy a duplicate", async () => {
    const day = await pastDay();
    const expired = jobsOf(day, 5);
    const [pending, replayed, oldReplay, discarded, late] = jobsOf(day, 5) as [string, string, string, string, string];
    await insertFences(pg.sql, [...expired, pending, replayed, oldReplay, discarded], consumer.name, 9 * DAY);
    await insertFences(pg.sql, [late], consumer.name, HOUR); // a late copy of an old job: its fence is recent
    await deadLetter(pending, "pending_review");
    await deadLetter(replayed, "replayed", 2 * HOUR);
    await deadLetter(discarded, "discarded", 10 * 60_000);
    await deadLetter(oldReplay, "replayed", 30 * HOUR); // replayed longer than a TTL ago: not kept
    expect(await fenceHome(pg.sql, late, consumer.name)).toBe(`processed_jobs_p${compact(day)}`);

    await pg.sql`delete from core.fence_horizons`;
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: TTL, consumers: [consumer] });
    const dry = await cleanup.run({ dryRun: true });
    expect(dry).toMatchObject({ partitionsDropped: 1, rowsMovedToDefault: 4, deleted: 0, dryRun: true });
    expect(await fencePartitions(pg.sql)).toContain(day);
    expect(await horizonAge()).toBeUndefined(); // a dry run deletes nothing, so moves no horizon

    const report = await cleanup.run();
    expect(report).toMatchObject({
      partitionsDropped: 1,
      rowsMovedToDefault: 4,
      partitionsDeferred: 0,
      partitionsKeptForOtherConsumers: 0,
      deleted: 0,
      complete: true,
    });
    expect(await fencePartitions(pg.sql)).not.toContain(day);
    expect(await fencePartitions(pg.sql, true)).not.toContain(day);
    // The horizon is the cutoff the run deleted with: a TTL ago, as of the run.
    const age = await horizonAge();
    expect(age).toBeGreaterThanOrEqual(TTL);
    expect(age).toBeLessThan(TTL + 60_000);
    for (const id of [pending, replayed, discarded, late]) {
      expect(await fenceHome(pg.sql, id, consumer.name)).toBe("processed_jobs_default");
      expect(await fenceInsert(pg.sql, id)).toHaveLength(0);
    }
    expect(await deliverCopy(late)).toMatchObject({ outcome: "duplicate" });
    // What the TTL let go is gone, like a deleted row: a copy now would write a new fence.
    expect(await fenceHome(pg.sql, oldReplay, consumer.name)).toBeUndefined();
    expect(await fenceInsert(pg.sql, expired[0] as string)).toHaveLength(1);
    const [effects] = await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`;
    expect(effects?.n).toBe(0);
    // The moved fences are the batches' from now on: kept while their letters need them.
    expect(await cleanup.run()).toMatchObject({ partitionsDropped: 0, deleted: 0, keptForPendingDeadLetters: 1 });
  });

  test("a fence insert racing the detach waits for it, then conflicts with the moved fence; a harness copy is a duplicate", async () => {
    const day = await pastDay();
    const [pending, late, expired] = jobsOf(day, 3) as [string, string, string];
    await insertFences(pg.sql, [pending, expired], consumer.name, 9 * DAY);
    await insertFences(pg.sql, [late], consumer.name, HOUR);
    await deadLetter(pending, "pending_review");

    // A work transaction in flight holds the fence table: the detach must wait for it.
    const blocker = await pg.sql.reserve();
    const racer = pg.connect({ max: 4 });
    try {
      await blocker`begin`;
      await blocker`insert into core.processed_jobs (job_id, consumer) values (${uuidv7()}, 'in.flight')`;
      const cleanup = createFenceCleanup({
        db: pg.connect({ max: 1 }).db,
        ttlMs: TTL,
        consumers: [consumer],
        partitionLockTimeoutMs: 20_000,
      });
      const running = cleanup.run();
      await waitUntil(
        () => pg.sql`select 1 from pg_stat_activity
          where query like '%fence_partition_detach%' and wait_event_type = 'Lock' and datname = current_database()`,
        "the detach waits for the fence table",
      );
      // Copies of the day's jobs arrive now: their fence inserts queue behind the detach.
      const inserts = [pending, late, expired].map((id) => fenceInsert(racer.sql, id).execute());
      const harnessCopy = deliverCopy(late, racer.db);
      await waitUntil(
        () => pg.sql`select 1 from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock' and query like 'insert into core.processed_jobs%'
          having count(*) >= 4`,
        "four fence inserts wait behind the detach",
      );
      await blocker`commit`;
      const report = await running;
      const [forPending, forLate, forExpired] = await Promise.all(inserts);
      expect(report).toMatchObject({ partitionsDropped: 1, rowsMovedToDefault: 2, partitionsDeferred: 0 });
      expect(forPending).toHaveLength(0);
      expect(forLate).toHaveLength(0);
      // The expired job's fence went with its day, as the batches would have deleted it.
      expect(forExpired).toHaveLength(1);
      expect(await harnessCopy).toMatchObject({ outcome: "duplicate" });
      for (const id of [pending, late, expired]) {
        expect(await fenceHome(pg.sql, id, consumer.name)).toBe("processed_jobs_default");
      }
    } finally {
      await blocker`rollback`.catch(() => {});
      blocker.release();
    }
  });

  test("a detach that cannot get its lock gives way and is deferred, leaving the day whole", async () => {
    const day = await pastDay();
    const ids = jobsOf(day, 3);
    await insertFences(pg.sql, ids, consumer.name, 9 * DAY);
    const blocker = await pg.sql.reserve();
    try {
      await blocker`begin`;
      await blocker`insert into core.processed_jobs (job_id, consumer) values (${uuidv7()}, 'in.flight')`;
      const cleanup = createFenceCleanup({
        db: pg.db,
        ttlMs: TTL,
        consumers: [consumer],
        partitionLockTimeoutMs: 50,
        partitionLockRetries: 1,
      });
      const started = Date.now();
      // Meanwhile a live fence insert never waits longer than the detach's lock timeout.
      const report = await cleanup.run();
      expect(report).toMatchObject({ partitionsDropped: 0, partitionsDeferred: 1, complete: true });
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(await fencePartitions(pg.sql)).toContain(day);
      await blocker`commit`;
      expect(await cleanup.run()).toMatchObject({ partitionsDropped: 1, rowsMovedToDefault: 0 });
    } finally {
      await blocker`rollback`.catch(() => {});
      blocker.release();
    }
  });

  test("a day that holds other consumers' fences is kept; the batches delete this cleanup's expired rows in it", async () => {
    const day = await pastDay();
    const mine = jobsOf(day, 3);
    const theirs = jobsOf(day, 2);
    await insertFences(pg.sql, mine, consumer.name, 9 * DAY);
    await insertFences(pg.sql, theirs, "billing.charge", 9 * DAY);
    const report = await createFenceCleanup({ db: pg.db, ttlMs: TTL, consumers: [consumer] }).run();
    expect(report).toMatchObject({ partitionsDropped: 0, partitionsKeptForOtherConsumers: 1, deleted: 3 });
    expect(await fencePartitions(pg.sql)).toContain(day);
    const left = await pg.sql<{ consumer: string }[]>`select consumer from core.processed_jobs`;
    expect(left.map((r) => r.consumer)).toEqual(["billing.charge", "billing.charge"]);
  });

  test("a fence written before its day began (a producer's clock ahead) goes with the batches once expired", async () => {
    const ahead = await dbDay(pg.sql, 2);
    expect(await fencePartitions(pg.sql)).toContain(ahead);
    const [early, fresh] = jobsOf(ahead, 2) as [string, string];
    await insertFences(pg.sql, [early], consumer.name, 2 * DAY);
    await insertFences(pg.sql, [fresh], consumer.name, 0);
    const [inDefault] = await jobsOf(await dbDay(pg.sql, -30), 1);
    await insertFences(pg.sql, [inDefault as string], consumer.name, 2 * DAY);
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: TTL, consumers: [consumer], batchSize: 1 });
    expect(await cleanup.run({ dryRun: true })).toMatchObject({ deleted: 2, scanned: 2, batches: 3 });
    expect(await cleanup.run()).toMatchObject({ deleted: 2, scanned: 2, batches: 3, partitionsDropped: 0 });
    expect(await fenceHome(pg.sql, early, consumer.name)).toBeUndefined();
    expect(await fenceHome(pg.sql, fresh, consumer.name)).toBe(`processed_jobs_p${compact(ahead)}`);
  });

  test("a day not wholly past the TTL is left whole, expired rows and all; an interrupted run's detached day is dropped", async () => {
    const yesterday = await dbDay(pg.sql, -1);
    await ensureFencePartitions({ db: pg.db, days: { first: yesterday, last: yesterday } });
    // Expired, and written during their day (a fence written before its day began would go with the batches).
    await pg.sql`
      insert into core.processed_jobs (job_id, consumer, processed_at)
      select unnest(${jobsOf(yesterday, 2)}::uuid[]), ${consumer.name}, ${yesterday}::date::timestamp at time zone 'UTC' + interval '1 second'`;
    const day = await pastDay();
    await insertFences(pg.sql, jobsOf(day, 2), consumer.name, 9 * DAY);
    // A run that detached the day (its kept fences moved with it) and stopped before the drop.
    await pg.sql.unsafe(`alter table core.processed_jobs detach partition core.processed_jobs_p${compact(day)}`);
    const report = await createFenceCleanup({ db: pg.db, ttlMs: TTL, consumers: [consumer] }).run();
    expect(report).toMatchObject({ partitionsDropped: 1, deleted: 0 });
    expect(await fencePartitions(pg.sql, true)).toEqual([]);
    expect(await fencePartitions(pg.sql)).toContain(yesterday);
    const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`;
    expect(row?.n).toBe(2);
  });
});

/** A plan node of `EXPLAIN (FORMAT JSON)`. */
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  Plans?: PlanNode[];
}
/** Scans of the fence's tables (parent, partitions) under `node` that no Limit bounds. */
const unboundedScans = (node: PlanNode): PlanNode[] =>
  node["Node Type"] === "Limit"
    ? []
    : [
        ...(node["Relation Name"]?.startsWith("processed_jobs") && /Scan/.test(node["Node Type"]) ? [node] : []),
        ...(node.Plans ?? []).flatMap(unboundedScans),
      ];
/** Aggregates (counts) over such scans: a count of the expired rows as a whole. */
const unboundedCounts = (node: PlanNode): PlanNode[] => [
  ...(node["Node Type"] === "Aggregate" && unboundedScans(node).length > 0 ? [node] : []),
  ...(node.Plans ?? []).flatMap(unboundedCounts),
];

describe("what the cleanup sends (#9 item 12, #23 item 4)", () => {
  test("no statement counts the expired fences as a whole, in the default partition or a day's", async () => {
    const day = await pastDay();
    await insertFences(pg.sql, jobsOf(day, 2000), consumer.name, 9 * DAY);
    await insertFences(pg.sql, jobsOf(await dbDay(pg.sql, -30), 3000), consumer.name, 30 * DAY);
    await pg.sql`analyze core.processed_jobs`;
    const { client, statements } = recordingClient(pg.url);
    try {
      const cleanup = createFenceCleanup({
        db: drizzle({ client }),
        ttlMs: TTL,
        consumers: [consumer],
        batchSize: 1000,
      });
      await cleanup.run({ dryRun: true });
      expect(await cleanup.run()).toMatchObject({ partitionsDropped: 1, deleted: 3000, batches: 4 });
    } finally {
      await client.end();
    }
    const touching = statements.filter((s) => s.query.includes("processed_jobs"));
    expect(touching.length).toBeGreaterThanOrEqual(6);
    for (const { query, parameters } of touching) {
      const [row] = await pg.sql.unsafe<{ "QUERY PLAN": { Plan: PlanNode }[] }[]>(
        `explain (format json) ${query}`,
        parameters as never[],
      );
      expect(unboundedCounts(row?.["QUERY PLAN"][0]?.Plan as PlanNode), query).toEqual([]);
    }
  });
});

describe("the worker role runs the schedule (#23 item 4)", () => {
  test("a login that is only a member of softcrum_worker creates partitions ahead and drops an expired day", async () => {
    const role = `sc_worker_${Math.random().toString(36).slice(2, 10)}`;
    await pg.sql.unsafe(`create role ${role} login in role softcrum_worker`);
    const url = new URL(pg.url);
    url.username = role;
    const client = postgres(url.toString(), { max: 2, onnotice: () => {} });
    try {
      const db = drizzle({ client });
      for (const day of await fencePartitions(pg.sql)) {
        await pg.sql.unsafe(`drop table core.processed_jobs_p${compact(day)}`);
      }
      expect((await ensureFencePartitions({ db, daysAhead: 3 })).created).toBeGreaterThanOrEqual(2);
      const day = await dbDay(pg.sql, -10);
      expect((await ensureFencePartitions({ db, days: { first: day, last: day } })).created).toBe(1);
      const [recent, old] = jobsOf(day, 2) as [string, string];
      await insertFences(pg.sql, [recent], consumer.name, HOUR);
      await insertFences(pg.sql, [old], consumer.name, 9 * DAY);
      const report = await createFenceCleanup({ db, ttlMs: TTL, consumers: [consumer] }).run();
      expect(report).toMatchObject({ partitionsDropped: 1, rowsMovedToDefault: 1, complete: true });
      expect(await fenceHome(pg.sql, recent, consumer.name)).toBe("processed_jobs_default");
      expect(await horizonAge()).toBeGreaterThanOrEqual(TTL); // the worker may record how far it deleted
      // It owns nothing and may not change the table itself.
      const refused = await client`alter table core.processed_jobs_default add column x int`.then(
        () => "allowed",
        (error: { code?: string }) => error.code,
      );
      expect(refused).toBe("42501");
    } finally {
      await client.end({ timeout: 5 });
      await pg.sql.unsafe(`drop role if exists ${role}`);
    }
  });
});
