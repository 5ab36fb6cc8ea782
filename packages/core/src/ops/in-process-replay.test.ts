/**
 * Issue #21 item 4: an in-process replay is reported stored only once its
 * consumer's outcome is durable in the database (its fence, or a dead letter
 * written), and is delivered once: a delivery that could write neither (here
 * a consumer whose database role may not INSERT into core.processed_jobs or
 * core.dead_letters), or that does not settle in time, is reported with one
 * line saying why, and nothing is kept for a later redelivery, so nothing
 * waits on it (`drain()`, `close()`).
 *
 * Real Postgres, and a real login role of its own (roles are cluster-wide:
 * a random name, dropped after the file).
 */
import { randomBytes } from "node:crypto";
import { useTestDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { awardConsumer, createEffectsTable, silentLogger } from "../../test/fixtures.ts";
import { createMemoryQueue, type DeliveryEvent, type MemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { createOps } from "./index.ts";
import { inProcessReplay, ReplayNotAppliedError, type ReplayTransport } from "./routes.ts";

const pg = useTestDatabase("in-process-replay");

const QUEUE = "ipr.points";
const CONSUMER = "ipr.award";
const broken = new Set<string>();
/** Jobs (by customer id) whose handler waits until released. */
const held = new Map<string, Promise<void>>();
const consumer = awardConsumer(CONSUMER, QUEUE, { broken, held });

/** A login role that may read core.* but not INSERT into core.processed_jobs or core.dead_letters. */
const role = `softcrum_t_ipr_${randomBytes(6).toString("hex")}`;
let restricted: postgres.Sql | undefined;

beforeAll(async () => {
  await createEffectsTable(pg.sql);
  await pg.sql.unsafe(`create role ${role} login`);
  await pg.sql.unsafe(`grant usage on schema core to ${role}`);
  await pg.sql.unsafe(`grant select on all tables in schema core to ${role}`);
  // Everything else its work and its letters touch, INSERT on those two aside.
  await pg.sql.unsafe(`grant update, delete on core.processed_jobs, core.dead_letters to ${role}`);
  await pg.sql.unsafe(`grant insert, update, delete on core.pending_letter_keys, core.dead_letter_payloads to ${role}`);
  await pg.sql.unsafe(`grant select, insert on test_effects to ${role}`);
  const url = new URL(pg.url);
  url.username = role;
  url.password = "";
  restricted = postgres(url.toString(), { max: 4, onnotice: () => {} });
});
afterAll(async () => {
  await restricted?.end({ timeout: 5 });
  // Its grants live in this database only: dropped with it, then the role.
  await pg.sql.unsafe(`drop owned by ${role}`);
  await pg.sql.unsafe(`drop role if exists ${role}`);
});

let queue: MemoryQueue;
let events: DeliveryEvent[];

/** A queue whose consumer connects as `as`: the test database's owner, or the restricted role. */
function start(as: "owner" | "restricted", options: { replayConcurrency?: number } = {}): MemoryQueue {
  queue = createMemoryQueue({ concurrency: 2, ...options });
  const db = as === "owner" ? pg.db : drizzle({ client: restricted as postgres.Sql });
  queue.subscribe(bindConsumer(consumer, { db, logger: silentLogger }));
  events = [];
  queue.onDelivery((e) => events.push(e));
  return queue;
}

beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  broken.clear();
  held.clear();
});
afterEach(async () => {
  await queue?.close();
});

const award = (customerId: string, points = 10) =>
  createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId, points } });
const effectsOf = async (jobId: string) =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects where job_id = ${jobId}`)[0]?.n;
const lettersOf = async (jobId: string) =>
  await pg.sql<{ status: string; error_class: string }[]>`
    select status, error_class from core.dead_letters where job_id = ${jobId} order by created_at`;

/** A pending letter of the consumer for `envelope`; its id. */
async function pendingLetter(envelope: Envelope): Promise<string> {
  const id = uuidv7();
  await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    values (${id}, ${envelope.job_id}, ${QUEUE}, ${CONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
  return id;
}

async function failure(promise: Promise<unknown>): Promise<ReplayNotAppliedError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error, `expected ReplayNotAppliedError, got ${String(error)}`).toBeInstanceOf(ReplayNotAppliedError);
  return error as ReplayNotAppliedError;
}

describe("an in-process replay is stored only once its consumer's outcome is durable (#21 item 4)", () => {
  test("a consumer that can write neither its fence nor a dead letter: one line naming the permission, nothing kept, drain and close return", async () => {
    start("restricted");
    const transport = inProcessReplay(queue);
    const envelope = award("no-grant", 5);
    const error = await failure(
      transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope)) as Promise<unknown>,
    );
    expect(error.message).toMatch(/permission denied for table processed_jobs/);
    expect(error.message).toMatch(/was not applied: its delivery wrote neither its fence nor a dead letter/);
    expect(error.message).not.toMatch(/\n/);
    expect(error.mayStillApply).toBe(false);
    // Delivered once: nothing is kept for a later redelivery.
    expect(queue.pending()).toBe(0);
    expect(events.map((e) => [e.lane, e.result.outcome])).toEqual([["replay", "deferred"]]);
    await expect(queue.drain()).resolves.toBeUndefined();
    await expect(queue.close()).resolves.toBeUndefined();
    expect(events).toHaveLength(1);
    expect(await effectsOf(envelope.job_id)).toBe(0);
    expect(await lettersOf(envelope.job_id)).toEqual([]);
  });

  test("a consumer that runs it: stored once its work committed, applied once", async () => {
    start("owner");
    const transport = inProcessReplay(queue);
    const envelope = award("fine", 7);
    const receipt = await transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope));
    expect(receipt).toEqual({ messageId: expect.any(String), stored: true });
    // Already applied when it answers: no drain needed.
    expect(await effectsOf(envelope.job_id)).toBe(1);
    expect(events.map((e) => [e.lane, e.result.outcome])).toEqual([["replay", "success"]]);
    // Again: a duplicate (its fence exists) is durable too, and changes nothing.
    await expect(transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope))).resolves.toMatchObject({
      stored: true,
    });
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
    expect(events.map((e) => e.result.outcome)).toEqual(["success", "duplicate"]);
  });

  test("a replay that fails again is stored: its dead letter was written", async () => {
    start("owner");
    const envelope = award("still-broken", 3);
    broken.add("still-broken");
    await expect(
      inProcessReplay(queue).deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope)),
    ).resolves.toMatchObject({ stored: true });
    expect(await lettersOf(envelope.job_id)).toEqual([{ status: "pending_review", error_class: "permanent" }]);
    expect(queue.pending()).toBe(0);
  });

  test("a delivery that does not settle in time: abandoned, nothing kept, its late result changes nothing; close returns", async () => {
    start("owner");
    const envelope = award("slow", 2);
    let release = () => {};
    held.set(
      "slow",
      new Promise<void>((r) => {
        release = r;
      }),
    );
    const transport = inProcessReplay(queue, { timeoutMs: 60_000 });
    // The caller's bound wins when it is the shorter.
    const error = await failure(
      transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope), { timeoutMs: 300 }) as Promise<unknown>,
    );
    expect(error.message).toMatch(/did not settle within 300 ms/);
    expect(error.message).not.toMatch(/\n/);
    expect(error.mayStillApply).toBe(true);
    expect(queue.pending()).toBe(0);
    await expect(queue.drain()).resolves.toBeUndefined();
    release();
    await expect(queue.close()).resolves.toBeUndefined();
    // It was never delivered again; the abandoned run reported nothing.
    expect(events).toEqual([]);
  });

  test("a replay still waiting for its lane's slot when the wait ends is taken off the lane: it never runs", async () => {
    start("owner", { replayConcurrency: 1 });
    const transport = inProcessReplay(queue);
    const first = award("first", 1);
    const second = award("second", 1);
    let release = () => {};
    held.set(
      "first",
      new Promise<void>((r) => {
        release = r;
      }),
    );
    const firstDone = transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(first));
    const error = await failure(
      transport.deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(second), { timeoutMs: 200 }) as Promise<unknown>,
    );
    expect(error.message).toMatch(/was not delivered within 200 ms/);
    expect(error.mayStillApply).toBe(false);
    release();
    await expect(firstDone).resolves.toMatchObject({ stored: true });
    await queue.drain();
    expect(events.map((e) => e.result.outcome)).toEqual(["success"]);
    expect(await effectsOf(first.job_id)).toBe(1);
    expect(await effectsOf(second.job_id)).toBe(0);
  });

  test("the ordinary replay publish is unchanged: a normal in-process replay through the operations ends replayed, its effect applied once", async () => {
    start("owner");
    const envelope: Envelope = award("ops-fine", 4);
    const id = await pendingLetter(envelope);
    const ops = createOps({ db: pg.db, replay: inProcessReplay(queue) });
    const report = await ops.deadLetters.replay([id], { operator: "ana", reason: "fixed" });
    expect(report.results).toEqual([{ id, outcome: "replayed" }]);
    await queue.drain();
    expect(await lettersOf(envelope.job_id)).toEqual([{ status: "replayed", error_class: "exhausted" }]);
    expect(await effectsOf(envelope.job_id)).toBe(1);
    await expect(queue.close()).resolves.toBeUndefined();
  });

  test("several in-process transports: the combined one waits for the outcome only when each of them can", async () => {
    start("owner");
    const { firstRoutingReplay } = await import("./routes.ts");
    const waiting = inProcessReplay(queue);
    const plain: ReplayTransport = { route: waiting.route, publishReplay: waiting.publishReplay };
    expect(typeof firstRoutingReplay([waiting, waiting]).deliverReplay).toBe("function");
    expect(firstRoutingReplay([waiting, plain]).deliverReplay).toBeUndefined();
    const envelope = award("combined", 1);
    await expect(
      firstRoutingReplay([waiting]).deliverReplay?.(QUEUE, CONSUMER, JSON.stringify(envelope)),
    ).resolves.toMatchObject({ stored: true });
    expect(await effectsOf(envelope.job_id)).toBe(1);
  });
  test("through the operations, a consumer that cannot write its fence nor a letter leaves the letter pending_review, the report names the permission in one line, close returns", async () => {
    start("restricted");
    const envelope: Envelope = award("ops-no-grant", 4);
    const id = await pendingLetter(envelope);
    const ops = createOps({ db: pg.db, replay: inProcessReplay(queue) });
    const report = await ops.deadLetters.replay([id], { operator: "ana", reason: "fixed" });
    expect(report.results).toEqual([
      { id, outcome: "failed", detail: expect.stringMatching(/permission denied for table processed_jobs/) },
    ]);
    expect(report.results[0]?.detail).not.toMatch(/\n/);
    expect(await lettersOf(envelope.job_id)).toEqual([{ status: "pending_review", error_class: "exhausted" }]);
    expect(queue.pending()).toBe(0);
    await expect(queue.drain()).resolves.toBeUndefined();
    await expect(queue.close()).resolves.toBeUndefined();
    expect(await effectsOf(envelope.job_id)).toBe(0);
  });

  test("a delivery still running when the wait ends and committing after it: the unclaim waits for its fence, and the letter stays replayed", async () => {
    start("owner");
    const envelope: Envelope = award("ops-slow", 4);
    let release = () => {};
    held.set(
      "ops-slow",
      new Promise<void>((r) => {
        release = r;
      }),
    );
    const id = await pendingLetter(envelope);
    const ops = createOps({ db: pg.db, replay: inProcessReplay(queue, { timeoutMs: 300 }) });
    const replaying = ops.deadLetters.replay([id], { operator: "ana", reason: "fixed" });
    // The handler is running (its fence inserted, uncommitted) when the wait ends: the unclaim waits for it.
    setTimeout(release, 800);
    const report = await replaying;
    expect(report.results).toEqual([{ id, outcome: "failed", detail: expect.stringMatching(/applied after all/) }]);
    expect(await lettersOf(envelope.job_id)).toEqual([{ status: "replayed", error_class: "exhausted" }]);
    expect(await effectsOf(envelope.job_id)).toBe(1);
  });
});
