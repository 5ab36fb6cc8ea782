import { sql as sqlTag } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effectConsumer, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { recordingClient } from "../../test/recording-client.ts";
import { createMemoryQueue, type DeliveryEvent, type MemoryQueue } from "../adapters/memory/index.ts";
import { createManualClock } from "../clock.ts";
import { bindConsumer, defineConsumer, fenceTtlMarginMs } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { InvalidConfigError, RateLimitedError } from "../errors.ts";
import { createOps } from "../ops/index.ts";
import { checkFenceTtl, createFenceCleanup, minimumFenceTtlMs, scheduleFenceCleanup } from "./fence-cleanup.ts";

const pg = useEffectsDatabase("fence-cleanup");
const HOUR = 3_600_000;
const MINUTE = 60_000;
const consumer = effectConsumer("cleanup.award"); // default policy: retries span 7.5 minutes

/** Fence rows processed `ageMs` ago (database time). */
async function fences(count: number, ageMs: number, consumerName = "cleanup.award"): Promise<string[]> {
  const ids = Array.from({ length: count }, () => uuidv7());
  await pg.sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select unnest(${ids}::uuid[]), ${consumerName}, now() - make_interval(secs => ${ageMs / 1000})`;
  return ids;
}
/** A dead letter of `jobId`; a replayed or discarded one changed status `changedAgoMs` ago (database time). */
async function deadLetter(jobId: string, status: "pending_review" | "replayed" | "discarded", changedAgoMs = 0) {
  const changed = status !== "pending_review";
  await pg.sql`
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                   status_changed_at, status_changed_by, status_reason)
    values (${uuidv7()}, ${jobId}, 'q', 'other.consumer', '{}', 5, 'e', 'exhausted', ${status},
            case when ${changed} then now() - make_interval(secs => ${changedAgoMs / 1000}) end,
            ${changed ? "ops" : null}, 'r')`;
}
const remaining = async () =>
  (await pg.sql<{ job_id: string }[]>`select job_id from core.processed_jobs`).map((r) => r.job_id);

/** A plan node of `EXPLAIN (FORMAT JSON)`. */
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  Plans?: PlanNode[];
}
/** Scans of `relation` under `node` that no Limit bounds. */
function unboundedScans(node: PlanNode, relation: string): PlanNode[] {
  if (node["Node Type"] === "Limit") return [];
  const own = isFence(node, relation) && /Scan/.test(node["Node Type"]) ? [node] : [];
  return [...own, ...(node.Plans ?? []).flatMap((child) => unboundedScans(child, relation))];
}
/** The fence table or one of its partitions (a plan names the partitions it scans, migration 0026). */
function isFence(node: PlanNode, relation: string): boolean {
  const name = node["Relation Name"];
  return name === relation || (name?.startsWith(`${relation}_`) ?? false);
}
/** Scans of `relation` (or a partition of it) anywhere under `node`. */
function scansOf(node: PlanNode, relation: string): number {
  const own = isFence(node, relation) && /Scan/.test(node["Node Type"]) ? 1 : 0;
  return own + (node.Plans ?? []).reduce((n, child) => n + scansOf(child, relation), 0);
}
/** Aggregates (counts) over rows of `relation` that no Limit bounds: a count of the whole expired set. */
function unboundedCounts(node: PlanNode, relation: string): PlanNode[] {
  const own = node["Node Type"] === "Aggregate" && unboundedScans(node, relation).length > 0 ? [node] : [];
  return [...own, ...(node.Plans ?? []).flatMap((child) => unboundedCounts(child, relation))];
}

/**
 * 30,000 expired fences (and 2,000 fresh ones): 1,100 kept for pending letters
 * (100 of them also replayed), 1,000 kept for a replay or discard less than a
 * TTL ago, 500 whose replay is older than the TTL (deleted).
 */
async function expiredWithLetters() {
  await pg.sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'cleanup.award', now() - interval '2 days' - make_interval(secs => n) from generate_series(1, 30000) n`;
  await pg.sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'cleanup.award', now() - interval '1 hour' from generate_series(1, 2000)`;
  await pg.sql`
    with numbered as (
      select job_id::text as job_id, row_number() over (order by job_id) as n
      from core.processed_jobs where processed_at < now() - interval '1 day'
    ), letters as (
      select job_id, 'pending_review' as status, null::interval as ago from numbered where n <= 1100
      union all select job_id, 'replayed', interval '2 hours' from numbered where n between 1001 and 1100
      union all select job_id, 'replayed', interval '10 minutes' from numbered where n between 1101 and 1800
      union all select job_id, 'discarded', interval '10 minutes' from numbered where n between 1801 and 2100
      union all select job_id, 'replayed', interval '25 hours' from numbered where n between 2101 and 2600
    )
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                   status_changed_at, status_changed_by, status_reason)
    select gen_random_uuid(), job_id, 'q', 'other.consumer', '{}', 5, 'e', 'exhausted', status,
           now() - ago, case when ago is null then null else 'ops' end, 'r'
    from letters`;
  await pg.sql`analyze core.processed_jobs`;
  await pg.sql`analyze core.dead_letters`;
}

describe("fence TTL cleanup", () => {
  test("sends no statement that counts the expired rows as a whole: every count is over a bounded page (#9 item 12)", async () => {
    await expiredWithLetters();
    const { client, statements } = recordingClient(pg.url);
    try {
      const cleanup = createFenceCleanup({
        db: drizzle({ client }),
        ttlMs: 24 * HOUR,
        consumers: [consumer],
        batchSize: 1000,
        pauseBetweenBatchesMs: 0,
      });
      // The plans are read before the run: the pages of a run that deleted would be gone.
      await cleanup.run({ dryRun: true });
      await cleanup.run({ maxBatches: 2 });
    } finally {
      await client.end();
    }
    const touching = statements.filter((s) => s.query.includes("core.processed_jobs"));
    expect(touching.length).toBeGreaterThanOrEqual(3);
    let scans = 0;
    for (const { query, parameters } of touching) {
      const [row] = await pg.sql.unsafe<{ "QUERY PLAN": { Plan: PlanNode }[] }[]>(
        `explain (format json) ${query}`,
        parameters as never[],
      );
      const plan = row?.["QUERY PLAN"][0]?.Plan as PlanNode;
      scans += scansOf(plan, "processed_jobs");
      expect(unboundedCounts(plan, "processed_jobs"), query).toEqual([]);
    }
    // The plans were read: the fence (its partitions, since 0026) is scanned in them.
    expect(scans).toBeGreaterThan(0);
  });

  test("the report's figures are sums over the pages it scanned and add up, in a dry run and a real one (#9 item 12)", async () => {
    await expiredWithLetters();
    const cleanup = createFenceCleanup({
      db: pg.db,
      ttlMs: 24 * HOUR,
      consumers: [consumer],
      batchSize: 1000,
      pauseBetweenBatchesMs: 0,
    });
    const expected = { scanned: 30_000, deleted: 27_900, keptForPendingDeadLetters: 1100, keptForReplays: 1000 };
    const bounded = await cleanup.run({ dryRun: true, maxBatches: 3 });
    expect(bounded).toMatchObject({ scanned: 3000, batches: 3, complete: false, dryRun: true });
    expect(bounded.deleted + bounded.keptForPendingDeadLetters + bounded.keptForReplays).toBe(3000);

    const dry = await cleanup.run({ dryRun: true });
    expect(dry).toMatchObject({ ...expected, batches: 31, complete: true });
    const [before] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`;
    expect(before?.n).toBe(32_000);

    const report = await cleanup.run();
    expect(report).toMatchObject({ ...expected, batches: 31, complete: true, dryRun: false });
    const [after] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`;
    expect(after?.n).toBe(32_000 - 27_900);
    // A second run finds only the kept rows, and says so.
    expect(await cleanup.run()).toMatchObject({ scanned: 2100, deleted: 0, keptForPendingDeadLetters: 1100 });
  });

  test("deletes expired rows, keeps rows inside the TTL and rows whose job has a pending dead letter", async () => {
    const expired = await fences(5, 25 * HOUR);
    const fresh = await fences(3, 10 * 60_000);
    const [protectedJob, replayedJob] = await fences(2, 30 * HOUR);
    await deadLetter(protectedJob as string, "pending_review");
    await deadLetter(replayedJob as string, "replayed", 25 * HOUR); // replayed longer than a TTL ago

    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer], batchSize: 2 });
    const dry = await cleanup.run({ dryRun: true });
    expect(dry).toMatchObject({ deleted: 6, keptForPendingDeadLetters: 1, keptForReplays: 0, dryRun: true });
    expect(await remaining()).toHaveLength(10);

    const report = await cleanup.run();
    expect(report).toMatchObject({ deleted: 6, keptForPendingDeadLetters: 1, keptForReplays: 0, dryRun: false });
    expect(report.batches).toBe(4); // 2 + 2 + 2 + an empty one that ends the run
    expect(new Set(await remaining())).toEqual(new Set([...fresh, protectedJob]));
    for (const id of expired) expect(await remaining()).not.toContain(id);
  });

  test("keeps the fences of a job whose letter was replayed (or discarded) less than a TTL ago, since a replay may still be delivered (#8 item 4)", async () => {
    const [recent, edge, old, discarded, oldDiscarded, pendingAndReplayed] = await fences(6, 30 * HOUR);
    await deadLetter(recent as string, "replayed", 10 * 60_000);
    await deadLetter(edge as string, "replayed", 23 * HOUR);
    await deadLetter(old as string, "replayed", 25 * HOUR);
    // A replay published whose status change failed leaves the letter pending; it may then be discarded.
    await deadLetter(discarded as string, "discarded", 10 * 60_000);
    await deadLetter(oldDiscarded as string, "discarded", 25 * HOUR);
    // Replayed, failed again: a new pending letter of the same job.
    await deadLetter(pendingAndReplayed as string, "replayed", 2 * HOUR);
    await deadLetter(pendingAndReplayed as string, "pending_review");

    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer], batchSize: 2 });
    const dry = await cleanup.run({ dryRun: true });
    expect(dry).toMatchObject({ deleted: 2, keptForPendingDeadLetters: 1, keptForReplays: 3 });
    const report = await cleanup.run();
    expect(report).toMatchObject({ deleted: 2, keptForPendingDeadLetters: 1, keptForReplays: 3 });
    expect(new Set(await remaining())).toEqual(new Set([recent, edge, discarded, pendingAndReplayed]));
  });

  test("a cleanup run between a replay's publish and its delivery leaves the fence, so the replay is a duplicate (#8 item 4)", async () => {
    // A job whose fence committed long ago while a letter of it waited for review
    // (a letter of another consumer of the queue, or one written before #8 item 3).
    const [jobId] = await fences(1, 30 * HOUR);
    const envelope = createEnvelope({
      jobId: jobId as string,
      tenantId: "t",
      kind: "points.award.v1",
      data: { customerId: "c", points: 1 },
    });
    const letterId = uuidv7();
    await pg.sql`
      insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${letterId}, ${jobId as string}, ${consumer.queue}, ${consumer.name}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    // The replay is published; nobody has received it yet.
    const queue = createMemoryQueue({ clock: createManualClock() });
    // The consumer runs elsewhere (it subscribes below): the registry names its route.
    const ops = createOps({ db: pg.db, queue, routes: [{ queue: consumer.queue, consumer: consumer.name }] });
    const replayed = await ops.deadLetters.replay([letterId], { operator: "ana", reason: "provider fixed" });
    expect(replayed.counts).toEqual({ replayed: 1 });
    expect(queue.pending()).toBe(1);

    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer] });
    const report = await cleanup.run();

    const outcomes: string[] = [];
    queue.onDelivery((e) => outcomes.push(e.result.outcome));
    queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
    await queue.drain();
    await queue.close();
    expect(outcomes).toEqual(["duplicate"]);
    const [effects] = await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`;
    expect(effects?.n).toBe(0);
    expect(report).toMatchObject({ deleted: 0, keptForReplays: 1 });
  });

  test("never deletes a row inside its retry window, even with the shortest TTL allowed", async () => {
    const policy = { maxAttempts: 3, baseDelayMs: 1000, maxDelayMs: 2000 }; // retries span 3 s
    const fast = defineConsumer({
      name: "fast",
      queue: "q",
      kind: "k.v1",
      schema: z.object({}),
      retry: policy,
      deferralHorizonMs: 1000,
      handle: async () => {},
    });
    // The shortest TTL allowed is 2 × 3 s + the 1 s deferral horizon; one millisecond less is refused.
    expect(minimumFenceTtlMs({ consumers: [fast] })).toBe(7000);
    expect(() => createFenceCleanup({ db: pg.db, ttlMs: 6999, consumers: [fast] })).toThrow(InvalidConfigError);
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 7000, consumers: [fast] });
    const insideRetryWindow = await fences(4, 2900, "fast");
    const insideTtl = await fences(4, 6500, "fast");
    const expired = await fences(4, 8000, "fast");
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
    ).toThrow(/at least 2 × 450000 \+ 43200000 \(deferral horizon\) \+ 518400000 \(transport hold\) = 562500000 ms/);
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
    expect((error as Error).message).toMatch(/at least 2 × 1270000 \+ 43200000 \(deferral horizon\) = 45740000 ms/);
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

/** Every delivery of `queue`, and a way to wait for the n-th. */
function recordDeliveries(queue: MemoryQueue) {
  const events: DeliveryEvent[] = [];
  let wake: (() => void) | undefined;
  queue.onDelivery((e) => {
    events.push(e);
    wake?.();
  });
  return {
    events,
    outcomes: () => events.map((e) => e.result.outcome),
    async count(n: number) {
      while (events.length < n) await new Promise<void>((resolve) => (wake = resolve));
    },
  };
}
const effectRows = async () => (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`)[0]?.n;
const award = () => createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 1 } });

describe("copies of a job that come back late (#9 item 1)", () => {
  test("a TTL shorter than the deferral horizon is refused: a copy waiting out a 429's Retry-After could outlive the fence (#9 item 1)", () => {
    // The issue's case: one copy deferred 1 h by a Retry-After, a 20-minute TTL.
    expect(() => checkFenceTtl({ ttlMs: 20 * MINUTE, consumers: [consumer] })).toThrow(
      /up to its deferral horizon of 43200000 ms, so the TTL must be at least 2 × 450000 \+ 43200000 \(deferral horizon\) = 44100000 ms/,
    );
    expect(minimumFenceTtlMs({ consumers: [consumer] })).toBe(12 * HOUR + 15 * MINUTE);
    // A consumer whose provider may ask for longer waits, given a longer horizon, needs a longer TTL.
    const patient = defineConsumer({ ...effectConsumer("cleanup.patient"), deferralHorizonMs: 48 * HOUR });
    expect(() => checkFenceTtl({ ttlMs: 24 * HOUR, consumers: [consumer, patient] })).toThrow(
      /too short for consumer "cleanup\.patient".* = 173700000 ms/,
    );
    expect(() => defineConsumer({ ...effectConsumer("cleanup.none"), deferralHorizonMs: 0 })).toThrow(
      /deferralHorizonMs must be a number of milliseconds from 1000/,
    );
    // The example worker's default (192 h) fits even Vercel Queues' 7-day hold.
    expect(() =>
      checkFenceTtl({ ttlMs: 192 * HOUR, consumers: [consumer], transportHoldMs: 168 * HOUR }),
    ).not.toThrow();
  });

  test("a copy told by a 429 to wait a day comes back while the fence another copy committed is still there, whenever an accepted cleanup runs (#9 item 1)", async () => {
    let limited = true; // the partner answers 429 "Retry-After: 24 h" while this holds
    const c = effectConsumer("cleanup.limited", async () => {
      if (limited) throw new RateLimitedError("partner 429", { retryAfterMs: 24 * HOUR });
    });
    const ttlMs = minimumFenceTtlMs({ consumers: [c] }); // the shortest TTL accepted
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const deliveries = recordDeliveries(queue);
    queue.subscribe(bindConsumer(c, { db: pg.db, logger: silentLogger, now: clock.now }));
    const envelope = award();

    // Two copies of one job: the first is deferred by the partner, the second commits.
    await queue.publish(c.queue, envelope);
    await deliveries.count(1);
    limited = false;
    await queue.publish(c.queue, envelope);
    await deliveries.count(2);
    expect(deliveries.outcomes()).toEqual(["rate_limited", "success"]);
    const [deferral] = deliveries.events;
    const wait = deferral?.result.outcome === "rate_limited" ? deferral.result.retryAfterMs : Number.NaN;

    // The cleanup runs at the last moment before the deferred copy is back:
    // the fence is that old by then (database time, moved back instead).
    await pg.sql`update core.processed_jobs set processed_at = now() - make_interval(secs => ${(wait - MINUTE) / 1000})`;
    const report = await createFenceCleanup({ db: pg.db, ttlMs, consumers: [c] }).run();

    await queue.drain();
    await queue.close();
    expect(await effectRows()).toBe(1);
    expect(deliveries.outcomes()).toEqual(["rate_limited", "success", "duplicate"]);
    expect(report.deleted).toBe(0);
    // The wait was cut to the 12 h horizon, which the TTL covers.
    expect(wait).toBe(12 * HOUR);
  });

  test("a Retry-After longer than the deferral horizon is cut to it: the job comes back sooner, and waits again if told to (#9 item 1)", async () => {
    let limited = 2;
    const c = defineConsumer({
      ...effectConsumer("cleanup.shortHorizon", async () => {
        if (limited-- > 0) throw new RateLimitedError("partner 429", { retryAfterMs: 3 * HOUR });
      }),
      deferralHorizonMs: HOUR,
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const deliveries = recordDeliveries(queue);
    queue.subscribe(bindConsumer(c, { db: pg.db, logger: silentLogger, now: clock.now }));
    const start = clock.now();
    await queue.publish(c.queue, award());
    await queue.drain();
    await queue.close();
    expect(deliveries.outcomes()).toEqual(["rate_limited", "rate_limited", "success"]);
    expect(deliveries.events.map((e) => e.at - start)).toEqual([0, HOUR, 2 * HOUR]);
    expect(await effectRows()).toBe(1);
  });

  test("a delivery whose handler cannot start is not deferred past its horizon: it is to be dead-lettered, not run late (#9 item 1)", async () => {
    // A real client to a port where nothing listens: the work cannot start, and no letter can be written.
    const client = postgres("postgres://postgres@127.0.0.1:1/none", { max: 1, connect_timeout: 1, onnotice: () => {} });
    try {
      const bound = bindConsumer(consumer, { db: drizzle({ client }), logger: silentLogger, random: () => 0.999 });
      const body = JSON.stringify(award());
      const inside = await bound.deliver({ body, deliveryCount: 1, deferrals: 40, dueAt: Date.now() - 11 * HOUR });
      expect(inside).toMatchObject({ outcome: "deferred", ack: false, spendsAttempt: false });
      // 5 minutes more would carry it past 12 h: the database being down, the
      // letter cannot be written, so the message is not acknowledged (it comes back, as an attempt).
      const past = await bound.deliver({
        body,
        deliveryCount: 1,
        deferrals: 41,
        dueAt: Date.now() - 12 * HOUR + MINUTE,
      });
      expect(past).toMatchObject({ outcome: "dead_letter_failed", ack: false });
    } finally {
      await client.end();
    }
  });

  test("past its horizon, a job whose handler could not start becomes an exhausted dead letter, or a duplicate when a copy committed (#9 item 1)", async () => {
    const ordered = defineConsumer({ ...effectConsumer("cleanup.ordered"), orderingKey: (data) => data.customerId });
    // Another session holds the job's ordering lock, and this pool gives up
    // waiting for a lock after 200 ms: the work cannot start (the letter
    // decision takes no ordering lock, so it can).
    const holder = await pg.sql.reserve();
    const client = postgres(pg.url, { max: 2, onnotice: () => {}, connection: { lock_timeout: 200 } });
    try {
      await holder`select pg_advisory_lock(hashtextextended(${`${ordered.name}|c`}, 0))`;
      const bound = bindConsumer(ordered, { db: drizzle({ client }), logger: silentLogger, random: () => 0.999 });
      const deliver = (envelope: ReturnType<typeof award>, dueAt: number) =>
        bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 1, deferrals: 40, dueAt });

      const fresh = award();
      expect(await deliver(fresh, Date.now())).toMatchObject({ outcome: "deferred", spendsAttempt: false });
      // Due 12 h ago less a minute: the next wait (about 5 minutes) would carry it past the horizon.
      const lone = award();
      const letter = await deliver(lone, Date.now() - 12 * HOUR + MINUTE);
      expect(letter).toMatchObject({ outcome: "dead_lettered", ack: true, errorClass: "exhausted" });
      const [row] = await pg.sql<{ job_id: string; last_error: string }[]>`
        select job_id, last_error from core.dead_letters where status = 'pending_review'`;
      expect(row?.job_id).toBe(lone.job_id);
      expect(row?.last_error).toMatch(
        /^deferred past its horizon: a wait of \d+ ms would bring the job back \d+ ms after it was due, beyond cleanup\.ordered's deferral horizon of 43200000 ms \(the handler could not start: /,
      );
      // A copy of a job another copy already committed is a duplicate, not a letter.
      const done = award();
      await pg.sql`insert into core.processed_jobs (job_id, consumer) values (${done.job_id}, ${ordered.name})`;
      expect(await deliver(done, Date.now() - 12 * HOUR + MINUTE)).toMatchObject({ outcome: "duplicate", ack: true });
      const [letters] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
      expect(letters?.n).toBe(1);
      expect(await effectRows()).toBe(0);
    } finally {
      holder.release();
      await client.end();
    }
  });
});

describe("the fence TTL is a law the harness obeys too (#18 item 3)", () => {
  const TTL = 2 * HOUR;
  const awardSchema = z.object({ customerId: z.string(), points: z.number() });
  const counted = () => {
    const counter = { runs: 0 };
    const definition = defineConsumer({
      name: `cleanup.law-${uuidv7()}`,
      queue: "cleanup.law",
      kind: "points.award.v1",
      schema: awardSchema,
      timeoutMs: 5_000,
      deferralHorizonMs: 60_000,
      async handle(data, { tx, envelope }) {
        counter.runs += 1;
        await tx.execute(
          sqlTag`insert into test_effects (job_id, consumer, amount) values (${envelope.job_id}, 'law', ${data.points})`,
        );
      },
    });
    return { definition, counter };
  };
  const effectsOf = async (jobId: string) =>
    (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects where job_id = ${jobId}`)[0]?.n;

  test("a copy that comes back after the cleanup removed its job's fence is not run: the job keeps its one effect, the copy is an expired letter with the evidence", async () => {
    const { definition, counter } = counted();
    const due = Date.now();
    let now = due;
    const bound = bindConsumer(definition, { db: pg.db, logger: silentLogger, fenceTtlMs: TTL, now: () => now });
    const e = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 5 } });
    // One copy commits right away; another was deferred (a 429 of the partner), for longer than the TTL.
    expect(await bound.deliver({ body: JSON.stringify(e), deliveryCount: 1, dueAt: due })).toMatchObject({
      outcome: "success",
    });
    // The TTL has passed for the fence (the database's clock): the cleanup, run with the same TTL, removes it.
    await pg.sql`update core.processed_jobs set processed_at = now() - make_interval(secs => ${TTL / 1000 + 1})
      where job_id = ${e.job_id}`;
    const report = await createFenceCleanup({ db: pg.db, ttlMs: TTL, consumers: [definition] }).run();
    expect(report.deleted).toBeGreaterThanOrEqual(1);
    now = due + TTL + 1_000;
    const late = await bound.deliver({ body: JSON.stringify(e), deliveryCount: 1, deferrals: 1, dueAt: due });
    expect(late).toMatchObject({ outcome: "dead_lettered", errorClass: "expired", ack: true });
    expect(counter.runs).toBe(1);
    expect(await effectsOf(e.job_id)).toBe(1);
    const [letter] = await pg.sql<
      { last_error: string }[]
    >`select last_error from core.dead_letters where job_id = ${e.job_id}`;
    expect(letter?.last_error).toMatch(/fence TTL.*check its effect before replaying/);
  });

  test("a copy due just before the TTL less the margin still runs; one just after is expired, or a duplicate when a copy committed", async () => {
    const { definition, counter } = counted();
    const margin = fenceTtlMarginMs(definition);
    const due = Date.now();
    let now = due;
    const bound = bindConsumer(definition, { db: pg.db, logger: silentLogger, fenceTtlMs: TTL, now: () => now });
    const fresh = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 1 } });
    const old = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 2 } });
    now = due + TTL - margin;
    expect(await bound.deliver({ body: JSON.stringify(fresh), deliveryCount: 1, dueAt: due })).toMatchObject({
      outcome: "success",
    });
    now = due + TTL - margin + 1;
    // The committed job's late copy finds its fence (the cleanup keeps it for the whole TTL): a duplicate.
    expect(await bound.deliver({ body: JSON.stringify(fresh), deliveryCount: 2, dueAt: due })).toMatchObject({
      outcome: "duplicate",
    });
    expect(await bound.deliver({ body: JSON.stringify(old), deliveryCount: 1, dueAt: due })).toMatchObject({
      outcome: "dead_lettered",
      errorClass: "expired",
    });
    expect(counter.runs).toBe(1);
    // A replay is measured from when it was replayed (its own due time): it runs.
    now = due + TTL * 3;
    expect(
      await bound.deliver({ body: JSON.stringify(old), deliveryCount: 1, replay: true, dueAt: now - 1_000 }),
    ).toMatchObject({ outcome: "dead_lettered" }); // its letter is still pending: the fence refuses it
    expect(counter.runs).toBe(1);
  });

  test("bindConsumer refuses a fenceTtlMs that does not leave room for the margin", () => {
    const { definition } = counted();
    expect(() => bindConsumer(definition, { db: pg.db, fenceTtlMs: fenceTtlMarginMs(definition) })).toThrow(
      InvalidConfigError,
    );
    expect(() => bindConsumer(definition, { db: pg.db, fenceTtlMs: Number.NaN })).toThrow(/fenceTtlMs/);
  });

  test("a fence is stamped when its insert runs, not when its transaction began: a wait on the ordering lock is not counted as age", async () => {
    const { definition } = counted();
    const ordered = defineConsumer({ ...definition, name: `${definition.name}-stamp`, orderingKey: () => "k" });
    const e = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 3 } });
    const holder = await pg.sql.reserve();
    try {
      await holder`select pg_advisory_lock(hashtextextended(${`${ordered.name}|k`}, 0))`;
      const started = Date.now();
      const delivery = bindConsumer(ordered, { db: pg.db, logger: silentLogger }).deliver({
        body: JSON.stringify(e),
        deliveryCount: 1,
      });
      await new Promise((r) => setTimeout(r, 1_500));
      await holder`select pg_advisory_unlock_all()`;
      expect(await delivery).toMatchObject({ outcome: "success" });
      const [row] = await pg.sql<{ stamped: number }[]>`
        select (extract(epoch from processed_at) * 1000)::float8 as stamped from core.processed_jobs where job_id = ${e.job_id}`;
      // The transaction began before the wait; the fence after it.
      expect((row?.stamped ?? 0) - started).toBeGreaterThanOrEqual(1_300);
    } finally {
      await holder`select pg_advisory_unlock_all()`;
      holder.release();
    }
  });
});
