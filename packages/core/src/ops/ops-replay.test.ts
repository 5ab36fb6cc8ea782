/**
 * Issue #10: replays that reach their consumer (routing, the original bytes,
 * a lane of their own), the two-person rule across batches and direct
 * replays, audited refusals and pauses, runners that never miscount, and
 * bounded work per step.
 */
import { useTestDatabase } from "@softcrum/testing";
import { asc, eq, sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { publishToDeadLetters } from "../../test/dead-letters.ts";
import { awardConsumer, createEffectsTable, silentLogger } from "../../test/fixtures.ts";
import { vercelHarness } from "../../test/vercel-transport.ts";
import { createMemoryQueue, type DeliveryEvent, type MemoryQueue } from "../adapters/memory/index.ts";
import { toVercelReplayTopic, toVercelTopic } from "../adapters/vercel/index.ts";
import { bindConsumer } from "../consumer.ts";
import { deadLetters, opsAudit, replayBatches, replayBatchItems } from "../db/schema.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { isSoftcrumError } from "../errors.ts";
import { createFenceCleanup } from "../maintenance/fence-cleanup.ts";
import { createOps, inProcessReplay, type Ops, type ReplayTransport, registeredReplay } from "./index.ts";

const pg = useTestDatabase("ops-replay");

const broken = new Set<string>();
/** Jobs (by customer id) whose handler waits until released. */
const held = new Map<string, Promise<void>>();
const QUEUE = "replay.points";
const CONSUMER = "replay.award";
const consumer = awardConsumer(CONSUMER, QUEUE, { broken, held });

let queue: MemoryQueue;
let ops: Ops;
let events: DeliveryEvent[];

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  broken.clear();
  held.clear();
  queue = createMemoryQueue({ concurrency: 4 });
  queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
  events = [];
  queue.onDelivery((e) => events.push(e));
  ops = createOps({ db: pg.db, queue, batchPolicy: { approvalThreshold: 5, pollIntervalMs: 20 } });
});
afterEach(async () => {
  await queue.close();
});

const award = (customerId: string, points = 10) =>
  createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId, points } });

/** Jobs for broken customers, each delivered until it became a dead letter; the letters' ids in order. */
const makeDeadLetters = (envelopes: Envelope[]) =>
  publishToDeadLetters({ db: pg.db, queue, queueName: QUEUE, broken }, envelopes);

/** A pending letter of a module this process knows nothing about. */
async function foreignLetter(queueName = "billing.invoices", consumerName = "billing.send"): Promise<string> {
  const id = uuidv7();
  const envelope = createEnvelope({ tenantId: "acme", kind: "invoice.send.v1", data: { invoice: 1 } });
  await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    values (${id}, ${envelope.job_id}, ${queueName}, ${consumerName}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
  return id;
}

const statusOf = async (id: string) =>
  (await pg.db.select({ s: deadLetters.status }).from(deadLetters).where(eq(deadLetters.id, id)))[0]?.s;
const effectsOf = async (jobId: string) =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects where job_id = ${jobId}`)[0]?.n;
const audit = () =>
  pg.db
    .select({
      operator: opsAudit.operator,
      action: opsAudit.action,
      result: opsAudit.result,
      detail: opsAudit.detail,
      scope: opsAudit.scope,
    })
    .from(opsAudit)
    .orderBy(asc(opsAudit.id));

async function refusal(promise: Promise<unknown>): Promise<{ code: string; message: string }> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isSoftcrumError(error), `expected a refusal, got ${String(error)}`).toBe(true);
  return error as { code: string; message: string };
}

/** A replay transport over `inner` whose publishes take `delayMs` and are recorded. */
function slowReplay(inner: ReplayTransport, delayMs: number, log: (string | Uint8Array)[] = []): ReplayTransport {
  return {
    route: (q, c) => inner.route(q, c),
    async publishReplay(q, c, body) {
      log.push(body);
      await new Promise((r) => setTimeout(r, delayMs));
      return inner.publishReplay(q, c, body);
    },
  };
}

describe("a replay reaches its consumer, or is refused (#10 item 1)", () => {
  test("in-process: a letter whose consumer does not run in this process is refused, audited, and stays pending_review", async () => {
    const id = await foreignLetter();
    const report = await ops.deadLetters.replay([id], { operator: "ana", reason: "partner fixed" });
    expect(report.results).toEqual([
      {
        id,
        outcome: "not_routable",
        detail: expect.stringMatching(/billing\.send.*billing\.invoices.*only transport here is in-process/),
      },
    ]);
    expect(await statusOf(id)).toBe("pending_review");
    expect(queue.pending()).toBe(0); // nothing was published
    expect(await audit()).toEqual([
      expect.objectContaining({ operator: "ana", action: "dead_letter.replay", result: "refused" }),
    ]);
  });

  test("registry: a letter of a module/queue no module registered is refused and audited; a registered one replays", async () => {
    const sent: { queue: string; consumer: string }[] = [];
    const hosted = registeredReplay(
      {
        publishReplay: async (q, body, { targetConsumer }) => {
          sent.push({ queue: q, consumer: targetConsumer });
          return queue.publishReplay(q, body, { targetConsumer });
        },
      },
      [{ queue: QUEUE, consumer: CONSUMER }],
      { transport: "Vercel Queues" },
    );
    const routed = createOps({ db: pg.db, replay: hosted });
    const [mine] = await makeDeadLetters([award("reg-1")]);
    const foreign = await foreignLetter();
    broken.clear();
    const report = await routed.deadLetters.replay([mine as string, foreign], { operator: "ana", reason: "fixed" });
    await queue.drain();
    expect(report.counts).toEqual({ replayed: 1, not_routable: 1 });
    expect(report.results[1]?.detail).toMatch(/no module registered this queue and consumer with Vercel Queues/);
    expect(sent).toEqual([{ queue: QUEUE, consumer: CONSUMER }]);
    expect(await statusOf(foreign)).toBe("pending_review");
    expect(await statusOf(mine as string)).toBe("replayed");

    const alone = await routed.deadLetters.replay([foreign], { operator: "ana", reason: "again" });
    expect(alone.counts).toEqual({ not_routable: 1 });
    expect((await audit()).map((a) => a.result)).toEqual(["ok", "refused"]);
  });

  test("a batch that meets a letter it cannot route pauses (audited) and leaves the letter pending", async () => {
    await makeDeadLetters([award("rb-1")]);
    const foreign = await foreignLetter();
    broken.clear();
    const batch = await ops.batches.create({ operator: "ana", reason: "sweep", ratePerSecond: 100 });
    const after = await ops.batches.run(batch.id, { operator: "ana" });
    expect(after.status).toBe("paused");
    expect(after.stopReason).toMatch(/replay not routable: .*billing\.send/);
    expect(await statusOf(foreign)).toBe("pending_review");
    expect((await audit()).filter((a) => a.action === "batch.pause")).toEqual([
      expect.objectContaining({
        result: "ok",
        scope: { batchId: batch.id, automatic: true, cause: "not_routable" },
      }),
    ]);
  });
});

describe("replay republishes the bytes received (#10 item 2)", () => {
  test("unknown top-level fields, the job_id's case and the spacing travel unchanged, and the job runs", async () => {
    const envelope = award("bytes-1", 7);
    broken.add("bytes-1");
    const raw = `{ "job_id":"${envelope.job_id.toUpperCase()}",  "tenant_id":"acme","kind":"points.award.v1","data":{"customerId":"bytes-1","points":7},"sent_at":"2026-11-30T09:00:00Z","correlation_id":"${envelope.correlation_id}","x_trace":{"hop":1} }`;
    await queue.publishRaw(QUEUE, raw);
    await queue.drain();
    const [row] = await pg.db.select().from(deadLetters);
    expect(row?.payload).toBe(raw); // the letter keeps the payload exactly as received
    broken.clear();

    const sent: (string | Uint8Array)[] = [];
    const recorded = createOps({ db: pg.db, replay: slowReplay(inProcessReplay(queue), 0, sent) });
    expect((await recorded.deadLetters.replay([row?.id as string], { operator: "ana", reason: "x" })).counts).toEqual({
      replayed: 1,
    });
    await queue.drain();
    expect(sent).toEqual([raw]);
    expect(await effectsOf(envelope.job_id)).toBe(1);
    expect(events.at(-1)).toMatchObject({ lane: "replay", result: { outcome: "success" } });
  });
});

describe("replays have their own lane (#10 item 3)", () => {
  test("replays waiting on the consumer's replay lane never take the live lane's slots", async () => {
    const one = createMemoryQueue({ concurrency: 1, replayConcurrency: 1 });
    try {
      one.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
      const lane: DeliveryEvent[] = [];
      one.onDelivery((e) => lane.push(e));
      const slow = ["lane-1", "lane-2", "lane-3"].map((c) => award(c));
      let release = () => {};
      const gate = new Promise<void>((r) => {
        release = r;
      });
      for (const e of slow) held.set((e.data as { customerId: string }).customerId, gate);
      for (const e of slow) await one.publishReplay(QUEUE, JSON.stringify(e), { targetConsumer: CONSUMER });
      // The replay lane is busy with the first replay (held); a live job still runs at once.
      const live = award("live-1");
      await one.publish(QUEUE, live);
      while (!lane.some((e) => e.lane === "live")) await new Promise((r) => setTimeout(r, 5));
      expect(lane).toEqual([
        expect.objectContaining({ lane: "live", result: expect.objectContaining({ outcome: "success" }) }),
      ]);
      expect(await effectsOf(live.job_id)).toBe(1);
      release();
      await one.drain();
      expect(lane.filter((e) => e.lane === "replay").map((e) => e.result.outcome)).toEqual([
        "success",
        "success",
        "success",
      ]);
    } finally {
      await one.close();
    }
  });
});

describe.each(["push", "poll"] as const)("Vercel Queues (%s): the replay lane (#10 items 2, 3)", (mode) => {
  test.each([
    ["202, stored later", { status: 202 }],
    ["202, never stored", { status: 202, store: false }],
    ["429 with Retry-After", { status: 429, retryAfter: 30 }],
    ["500", { status: 500 }],
    ["503", { status: 503 }],
    ["no answer in time (stored)", { status: 201, delayMs: 1_500 }],
    ["connection lost before storing", { status: 201, dropConnection: "before" as const }],
    ["connection lost after storing", { status: 201, dropConnection: "after" as const }],
  ])(
    "a replay answered %s is not recorded as replayed: the letter stays pending, nothing runs, and a replay answered 201 then runs it once (#19)",
    async (_, answer) => {
      const h = await vercelHarness(mode);
      try {
        h.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
        const envelope = award("vercel-answers", 4);
        const id = uuidv7();
        await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${id}, ${envelope.job_id}, ${QUEUE}, ${CONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
        const viaVercel = createOps({
          db: pg.db,
          queue: h.queue,
          routes: [{ queue: QUEUE, consumer: CONSUMER }],
          publishTimeoutMs: 1_000,
        });
        h.fake.failNextSends(answer);
        const first = await viaVercel.deadLetters.replay([id], { operator: "ana", reason: "x" });
        expect(first.counts).toEqual({ failed: 1 });
        expect(await statusOf(id)).toBe("pending_review");
        // A send still in flight after the timeout lands now; whatever was stored is delivered.
        await new Promise((r) => setTimeout(r, 700));
        await h.settle();
        expect(await effectsOf(envelope.job_id)).toBe(0);
        expect(await statusOf(id)).toBe("pending_review");
        expect((await viaVercel.deadLetters.replay([id], { operator: "ana", reason: "x" })).counts).toEqual({
          replayed: 1,
        });
        await h.settle();
        expect(await effectsOf(envelope.job_id)).toBe(1);
      } finally {
        await h.close();
      }
    },
  );

  test("a replay goes to the consumer's own replay topic with the letter's bytes unwrapped, and runs as a replay", async () => {
    const h = await vercelHarness(mode);
    try {
      const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
      h.subscribe(bound);
      const envelope = award("vercel-1", 3);
      const raw = `{"x_first":true, "job_id":"${envelope.job_id.toUpperCase()}","tenant_id":"acme","kind":"points.award.v1","correlation_id":"${envelope.correlation_id}","data":{"customerId":"vercel-1","points":3}}`;
      const id = uuidv7();
      await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${id}, ${envelope.job_id}, ${QUEUE}, ${CONSUMER}, ${raw}, 5, 'e', 'exhausted')`;
      const viaVercel = createOps({ db: pg.db, queue: h.queue, routes: [{ queue: QUEUE, consumer: CONSUMER }] });
      expect((await viaVercel.deadLetters.replay([id], { operator: "ana", reason: "x" })).counts).toEqual({
        replayed: 1,
      });
      const [sent] = h.fake.sends;
      expect(sent?.topic).toBe(toVercelReplayTopic(QUEUE, CONSUMER));
      expect(sent?.topic).not.toBe(toVercelTopic(QUEUE));
      expect(sent?.body.toString("utf8")).toBe(raw);
      expect(sent?.idempotencyKey).toBeUndefined();
      await h.settle();
      expect(await effectsOf(envelope.job_id)).toBe(1);
      expect(await statusOf(id)).toBe("replayed");
    } finally {
      await h.close();
    }
  });
});

describe("Vercel Queues: a poll worker's replay lanes (#10 item 3)", () => {
  test("startWorker reads the consumer's replay topic on lanes of its own (replayConcurrency)", async () => {
    const h = await vercelHarness("poll");
    const worker = h.queue.startWorker(bindConsumer(consumer, { db: pg.db, logger: silentLogger }), {
      concurrency: 1,
      replayConcurrency: 1,
      idleDelayMs: 5,
    });
    try {
      const envelope = award("worker-lane", 2);
      await h.queue.publishReplay(QUEUE, JSON.stringify(envelope), { targetConsumer: CONSUMER });
      for (let i = 0; i < 400 && (await effectsOf(envelope.job_id)) === 0; i++) {
        await new Promise((r) => setTimeout(r, 25));
      }
      expect(await effectsOf(envelope.job_id)).toBe(1);
      expect(h.fake.sends.map((s) => s.topic)).toEqual([toVercelReplayTopic(QUEUE, CONSUMER)]);
    } finally {
      await worker.stop();
      await h.close();
    }
  });
});

describe("the two-person rule counts what one requester replays (#10 item 4)", () => {
  test("splitting a selection into batches under the threshold (limit) needs approval once the total passes it", async () => {
    await makeDeadLetters(Array.from({ length: 8 }, (_, i) => award(`split-${i}`)));
    const first = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, limit: 4 });
    expect(first.status).toBe("ready");
    const second = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, limit: 4 });
    expect(second.status).toBe("awaiting_approval"); // 4 + 4 > 5
    // Another requester's count is their own.
    await pg.sql`update core.replay_batches set status = 'stopped' where id = ${second.id}`;
    expect((await ops.batches.create({ operator: "bo", reason: "x", ratePerSecond: 100, limit: 4 })).status).toBe(
      "ready",
    );
  });

  test("looping direct replays hits the threshold: refused with FORBIDDEN, audited, letters stay pending", async () => {
    const ids = await makeDeadLetters(Array.from({ length: 8 }, (_, i) => award(`loop-${i}`)));
    broken.clear();
    expect((await ops.deadLetters.replay(ids.slice(0, 3), { operator: "ana", reason: "x" })).counts).toEqual({
      replayed: 3,
    });
    const error = await refusal(ops.deadLetters.replay(ids.slice(3, 6), { operator: "ana", reason: "x" }));
    expect(error.code).toBe("FORBIDDEN");
    expect(error.message).toMatch(/ana replayed 3 letters without a second operator's approval.*threshold of 5/);
    for (const id of ids.slice(3, 6)) expect(await statusOf(id)).toBe("pending_review");
    expect((await audit()).at(-1)).toMatchObject({ action: "dead_letter.replay", result: "rejected" });
    // Direct replays count toward a batch too.
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, limit: 3 });
    expect(batch.status).toBe("awaiting_approval");
  });
});

describe("the two-person rule under concurrent direct replays (#10 item 4)", () => {
  /**
   * Two sessions of one operator, forced into lockstep: each one's k-th
   * publish waits until the other has started its k-th publish too, is
   * blocked on a quota lock, or is done. Counting before claiming would let
   * both pass the threshold by counting at once; here the interleaving that
   * exposes it always happens.
   */
  async function inLockstep<T>(run: (a: Ops, b: Ops) => [Promise<T>, Promise<T>]): Promise<[T, T]> {
    const state = { started: [0, 0], done: [false, false] };
    const blockedOnQuota = async () => {
      const [row] = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from pg_locks
        where locktype = 'advisory' and objsubid = 2 and not granted
          and database = (select oid from pg_database where datname = current_database())`;
      return (row?.n ?? 0) > 0;
    };
    const lane = (me: 0 | 1): ReplayTransport => {
      const base = inProcessReplay(queue);
      const other = 1 - me;
      return {
        route: (q, c) => base.route(q, c),
        async publishReplay(q, c, body) {
          const k = (state.started[me] ?? 0) + 1;
          state.started[me] = k;
          while (!((state.started[other] ?? 0) >= k || state.done[other] || (await blockedOnQuota()))) {
            await new Promise((resolve) => setTimeout(resolve, 5));
          }
          return base.publishReplay(q, c, body);
        },
      };
    };
    const a = createOps({ db: pg.db, replay: lane(0), approvalThreshold: 5 });
    const b = createOps({ db: pg.connect({ max: 2 }).db, replay: lane(1), approvalThreshold: 5 });
    const [pa, pb] = run(a, b);
    const settle = (p: Promise<T>, i: 0 | 1) =>
      p.finally(() => {
        state.done[i] = true;
      });
    return Promise.all([settle(pa, 0), settle(pb, 1)]);
  }

  test("two direct replays of one operator at once never pass the threshold together", async () => {
    const ids = await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`conc-${i}`)));
    broken.clear();
    // 3 + 3 against a threshold of 5: each call passes its own up-front check.
    const [a, b] = await inLockstep((x, y) => [
      x.deadLetters.replay(ids.slice(0, 3), { operator: "ana", reason: "x" }),
      y.deadLetters.replay(ids.slice(3, 6), { operator: "ana", reason: "y" }),
    ]);
    expect((a.counts.replayed ?? 0) + (b.counts.replayed ?? 0)).toBe(5);
    expect((a.counts.needs_approval ?? 0) + (b.counts.needs_approval ?? 0)).toBe(1);
    const [row] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters where status = 'replayed'`;
    expect(row?.n).toBe(5);
    expect([...a.results, ...b.results].find((r) => r.outcome === "needs_approval")?.detail).toMatch(
      /ana replayed 5 letters without a second operator's approval .* threshold of 5/,
    );
  });

  test("two batches of one operator created at once: the second counts the first (approval threshold)", async () => {
    await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`bc-${i}`)));
    broken.clear();
    const other = createOps({ db: pg.connect({ max: 2 }).db, queue, approvalThreshold: 5 });
    const solo = createOps({ db: pg.db, queue, approvalThreshold: 5 });
    let creations: Promise<Awaited<ReturnType<Ops["batches"]["create"]>>[]> | undefined;
    // Both creations run while their inserts are held back by a table lock, so
    // both have counted before either commits, unless counting is serialised.
    await pg.sql.begin(async (tx) => {
      await tx`lock table core.replay_batches in share mode`;
      // Each selects 3 letters (under the threshold of 5 alone); together 6 pass it.
      creations = Promise.all([
        solo.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, limit: 3 }),
        other.batches.create({ operator: "ana", reason: "y", ratePerSecond: 100, limit: 3 }),
      ]);
      for (;;) {
        const [row] = await tx<{ n: number }[]>`
          select count(*)::int as n from pg_locks
          where not granted and database = (select oid from pg_database where datname = current_database())`;
        if ((row?.n ?? 0) >= 2) break;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    });
    const [x, y] = await (creations as NonNullable<typeof creations>);
    expect([x?.status, y?.status].sort()).toEqual(["awaiting_approval", "ready"]);
  });
});

describe("refusals and pauses are audited (#10 item 5)", () => {
  test("batch run refused while awaiting approval is audited (rejected, like every refusal of the library)", async () => {
    await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`aw-${i}`)));
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 });
    const error = await refusal(ops.batches.run(batch.id, { operator: "ana" }));
    expect(error.code).toBe("CONFLICT");
    expect((await audit()).at(-1)).toMatchObject({
      operator: "ana",
      action: "batch.run",
      result: "rejected",
      detail: expect.stringMatching(/awaits approval/),
      scope: { batchId: batch.id },
    });
  });

  test("replaying an already-replayed letter is audited as refused and says who replayed it", async () => {
    const [id] = await makeDeadLetters([award("twice")]);
    broken.clear();
    await ops.deadLetters.replay([id as string], { operator: "ana", reason: "x" });
    const again = await ops.deadLetters.replay([id as string], { operator: "bo", reason: "y" });
    expect(again.results).toEqual([
      { id, outcome: "not_pending", detail: "status is replayed, by ana: nothing to do" },
    ]);
    expect((await audit()).map((a) => [a.operator, a.result])).toEqual([
      ["ana", "ok"],
      ["bo", "refused"],
    ]);
  });

  test("an interrupted run (Ctrl-C), a failed sample and a failure rate each pause the batch as an audited action", async () => {
    await makeDeadLetters(Array.from({ length: 4 }, (_, i) => award(`ctl-${i}`)));
    broken.clear();
    const controller = new AbortController();
    const interrupted = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, batchSize: 1 });
    const paused = await ops.batches.run(interrupted.id, {
      operator: "ana",
      signal: controller.signal,
      onProgress: (p) => {
        if (p.batch.replayed === 1) controller.abort();
      },
    });
    expect(paused.status).toBe("paused");

    await pg.sql`truncate core.dead_letters, core.replay_batches, core.replay_batch_items cascade`;
    await makeDeadLetters(Array.from({ length: 3 }, (_, i) => award(`smp-${i}`))); // still broken
    const sampled = await ops.batches.create({ operator: "bo", reason: "x", ratePerSecond: 100, sampleSize: 1 });
    expect((await ops.batches.run(sampled.id, { operator: "bo" })).stopReason).toMatch(/^sample:/);

    await pg.sql`truncate core.dead_letters, core.replay_batches, core.replay_batch_items cascade`;
    await makeDeadLetters(Array.from({ length: 30 }, (_, i) => award(`fr-${i}`))); // still broken
    const failing = await ops.batches.create({
      operator: "cy",
      reason: "x",
      ratePerSecond: 100,
      batchSize: 5,
      maxFailureRate: 0.5,
    });
    await ops.batches.approve(failing.id, { operator: "dee" });
    expect((await ops.batches.run(failing.id, { operator: "dee" })).stopReason).toMatch(/^failure rate/);

    const pauses = (await audit()).filter((a) => a.action === "batch.pause");
    expect(pauses.slice(0, 2)).toEqual([
      expect.objectContaining({
        operator: "ana",
        result: "ok",
        scope: { batchId: interrupted.id, automatic: false, cause: "interrupted" },
        detail: expect.stringMatching(/^interrupted/),
      }),
      expect.objectContaining({
        operator: "bo",
        scope: { batchId: sampled.id, automatic: true, cause: "sample" },
        detail: expect.stringMatching(/^sample:/),
      }),
    ]);
    expect(pauses[2]).toMatchObject({
      operator: "dee",
      scope: { batchId: failing.id, automatic: true, cause: "failure_rate" },
      detail: expect.stringMatching(/^failure rate/),
    });
  });
});

describe("two runners on one batch never miscount (#10 item 9)", () => {
  test("a slow publish longer than the lease: the lease is renewed, a second runner is refused, nothing is skipped", async () => {
    await makeDeadLetters(Array.from({ length: 3 }, (_, i) => award(`slow-${i}`)));
    broken.clear();
    const slow = createOps({
      db: pg.db,
      replay: slowReplay(inProcessReplay(queue), 400),
      batchPolicy: { leaseMs: 150, approvalThreshold: 5 },
    });
    const batch = await slow.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, batchSize: 1 });
    const first = slow.batches.run(batch.id, { operator: "ana" });
    // Well past the lease, in the middle of the first publish.
    await new Promise((r) => setTimeout(r, 250));
    const second = await refusal(slow.batches.run(batch.id, { operator: "bo" }));
    expect(second.code).toBe("CONFLICT");
    expect(second.message).toMatch(/being run by another runner \(ana@/);
    const done = await first;
    await queue.drain();
    expect(done).toMatchObject({ status: "completed", replayed: 3, skipped: 0, succeeded: 3 });
  });

  test("a rate whose pause between replays is longer than the lease: the lease is renewed while waiting", async () => {
    await makeDeadLetters(Array.from({ length: 2 }, (_, i) => award(`rate-${i}`)));
    broken.clear();
    const leasing = createOps({ db: pg.db, queue, batchPolicy: { leaseMs: 100, approvalThreshold: 5 } });
    const batch = await leasing.batches.create({ operator: "ana", reason: "x", ratePerSecond: 2, batchSize: 1 });
    const first = leasing.batches.run(batch.id, { operator: "ana" });
    await new Promise((r) => setTimeout(r, 250)); // waiting 500 ms between replays, lease 100 ms
    expect((await refusal(leasing.batches.run(batch.id, { operator: "bo" }))).code).toBe("CONFLICT");
    expect(await first).toMatchObject({ status: "completed", replayed: 2, skipped: 0 });
  });

  test("a claim that loses the race reports which batch replayed the letter", async () => {
    const [id] = await makeDeadLetters([award("race")]);
    broken.clear();
    const slow = createOps({ db: pg.db, replay: slowReplay(inProcessReplay(queue), 300) });
    // The database lets a batch claim only its own letters while it runs.
    const { id: batchId } = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 1 });
    // …under the runner that leases it (migration 0034).
    await pg.db.execute(
      sql`update core.replay_batches set status = 'running', lease_owner = 'R', lease_expires_at = now() + interval '1 minute'
          where id = ${batchId}`,
    );
    const winner = slow.deadLetters.replayOne(id as string, {
      operator: "ana",
      reason: "x",
      batchId,
      guard: { runner: "R", deadline: null },
    });
    await new Promise((r) => setTimeout(r, 100)); // the winner holds the letter, publishing
    const loser = await ops.deadLetters.replayOne(id as string, { operator: "bo", reason: "y", batchId: null });
    expect(await winner).toEqual({ outcome: "replayed" });
    expect(loser).toMatchObject({ outcome: "not_pending", replayBatchId: batchId });
    expect(loser.detail).toMatch(new RegExp(`by batch ${batchId}`));
  });
});

describe("bounded work per step (#10 item 10)", () => {
  test("each replayed job is resolved once and counted on the row; get() writes nothing", async () => {
    const envelopes = Array.from({ length: 4 }, (_, i) => award(`inc-${i}`));
    await makeDeadLetters(envelopes);
    broken.delete("inc-0");
    broken.delete("inc-1");
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 200, batchSize: 2 });
    await ops.batches.run(batch.id, { operator: "ana" });
    await queue.drain();
    const items = await pg.db
      .select({ resolution: replayBatchItems.resolution })
      .from(replayBatchItems)
      .where(eq(replayBatchItems.batchId, batch.id));
    const [row] = await pg.db.select().from(replayBatches).where(eq(replayBatches.id, batch.id));
    // What the runner resolved is on the items and counted on the row, once.
    const resolved = items.filter((i) => i.resolution !== null).length;
    expect((row?.succeeded ?? 0) + (row?.failedAgain ?? 0)).toBe(resolved);
    // get() adds the jobs resolved since, without writing them.
    const before = await pg.sql`select * from core.replay_batch_items where batch_id = ${batch.id} order by position`;
    const view = await ops.batches.get(batch.id);
    expect(view).toMatchObject({ replayed: 4, succeeded: 2, failedAgain: 2, unresolved: 0, pending: 0 });
    expect(await pg.sql`select * from core.replay_batch_items where batch_id = ${batch.id} order by position`).toEqual(
      before,
    );
  });

  test("batches are listed a page at a time with a cursor", async () => {
    await makeDeadLetters(Array.from({ length: 3 }, (_, i) => award(`page-${i}`)));
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const b = await ops.batches.create({ operator: `op${i}`, reason: "x", ratePerSecond: 1, limit: 1 });
      ids.push(b.id);
    }
    const first = await ops.batches.list({ limit: 2 });
    expect(first.map((b) => b.id)).toEqual([ids[2], ids[1]]);
    const next = await ops.batches.list({ limit: 2, cursor: first.at(-1)?.id as string });
    expect(next.map((b) => b.id)).toEqual([ids[0]]);
  });
});

describe("replaying again a replay that never ran (#21 item 4)", () => {
  test("a letter marked replayed whose copy was lost is replayed again once; one that ran, or a pending one, is not", async () => {
    const [id, pending] = await makeDeadLetters([award("lost-copy", 7), award("still-pending")]);
    broken.clear();
    // A transport that says "stored" and loses the copy (an in-process queue killed mid-way).
    const inProcess = inProcessReplay(queue);
    const losing: ReplayTransport = {
      route: (q, c) => inProcess.route(q, c),
      publishReplay: async () => ({ messageId: "lost", stored: true }),
    };
    const lossy = createOps({ db: pg.db, replay: losing });
    expect((await lossy.deadLetters.replay([id as string], { operator: "ana", reason: "x" })).counts).toEqual({
      replayed: 1,
    });
    await queue.drain();
    const [letter] = await pg.sql<
      { job_id: string }[]
    >`select job_id from core.dead_letters where id = ${id as string}`;
    expect(await statusOf(id as string)).toBe("replayed");
    expect(await effectsOf(letter?.job_id as string)).toBe(0);
    expect(await ops.deadLetters.replayOutcomes([id as string, pending as string])).toEqual([
      { id, outcome: "not_yet" }, // the pending one is no replay: left out
    ]);

    const again = await ops.deadLetters.replayAgain([id as string, pending as string], {
      operator: "ana",
      reason: "the first replay never ran",
    });
    expect(again.results).toEqual([
      { id, outcome: "replayed" },
      {
        id: pending,
        outcome: "not_pending",
        detail: expect.stringMatching(/only a replayed letter whose replay never ran is replayed again/),
      },
    ]);
    await queue.drain();
    expect(await effectsOf(letter?.job_id as string)).toBe(1);
    expect(await ops.deadLetters.replayOutcomes([id as string])).toEqual([{ id, outcome: "succeeded" }]);

    // It ran now: replaying it again is refused, and nothing is published.
    const twice = await ops.deadLetters.replayAgain([id as string], { operator: "ana", reason: "again?" });
    expect(twice.results).toEqual([
      { id, outcome: "not_pending", detail: expect.stringMatching(/its replay ran: the job has a fence/) },
    ]);
    await queue.drain();
    expect(await effectsOf(letter?.job_id as string)).toBe(1);
    expect((await audit()).filter((a) => a.action === "dead_letter.replay_again").map((a) => a.result)).toEqual([
      "ok",
      "refused",
    ]);
  });

  test("a replay whose fence the TTL cleanup deleted is never replayed again: whether it ran cannot be known any more", async () => {
    const [id] = await makeDeadLetters([award("ran-long-ago", 3)]);
    broken.clear();
    expect((await ops.deadLetters.replay([id as string], { operator: "ana", reason: "fixed" })).counts).toEqual({
      replayed: 1,
    });
    await queue.drain();
    const [letter] = await pg.sql<
      { job_id: string }[]
    >`select job_id from core.dead_letters where id = ${id as string}`;
    const jobId = letter?.job_id as string;
    expect(await effectsOf(jobId)).toBe(1);
    // Nine days later: the replay and its run are older than the fence's TTL (8 days), so the cleanup deletes the fence.
    await pg.sql`update core.dead_letters set status_changed_at = status_changed_at - interval '9 days' where id = ${id as string}`;
    await pg.sql`update core.processed_jobs set processed_at = processed_at - interval '9 days' where job_id = ${jobId}`;
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 8 * 24 * 3_600_000, consumers: [consumer] });
    expect(await cleanup.run()).toMatchObject({ deleted: 1, complete: true });

    const again = await ops.deadLetters.replayAgain([id as string], { operator: "ana", reason: "did it run?" });
    expect(again.results).toEqual([
      { id, outcome: "not_pending", detail: expect.stringMatching(/fence cleanup's horizon .* cannot be known/) },
    ]);
    await queue.drain();
    expect(await effectsOf(jobId)).toBe(1);
    expect(await statusOf(id as string)).toBe("replayed");
    expect(await ops.deadLetters.replayOutcomes([id as string])).toEqual([{ id, outcome: "unknown" }]);
    // Called by hand, the database's function refuses it too.
    expect(await pg.sql`select * from core.ops_reclaim_letter(${id as string}::uuid, 'ana', 'by hand')`).toHaveLength(
      0,
    );
  });
});
