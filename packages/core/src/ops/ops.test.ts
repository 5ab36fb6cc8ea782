import { useTestDatabase } from "@softcrum/testing";
import { eq, sql } from "drizzle-orm";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { publishToDeadLetters } from "../../test/dead-letters.ts";
import { createEffectsTable, effects, silentLogger } from "../../test/fixtures.ts";
import { createMemoryQueue, type MemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { deadLetters, opsAudit, replayBatches } from "../db/schema.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { isSoftcrumError, PermanentError } from "../errors.ts";
import { createOps, inProcessReplay, type Ops, type ReplayTransport } from "./index.ts";

const pg = useTestDatabase("ops");

/** Customers whose jobs fail for good, until a test "deploys the fix" by removing them. */
const broken = new Set<string>();
const QUEUE = "ops.points";
const consumer = defineConsumer({
  name: "ops.award",
  queue: QUEUE,
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    if (broken.has(data.customerId)) throw new PermanentError(`customer ${data.customerId} is broken`);
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "ops.award", amount: data.points });
  },
});

let queue: MemoryQueue;
let ops: Ops;
/** Every replay the operations publish: where, and the bytes (with the envelope they hold). */
let published: { queue: string; consumer: string; body: string | Uint8Array; envelope: Envelope }[];
/** The in-process replay transport over `queue`, recording each publish (and calling `onPublish` first). */
const recordingReplay = (onPublish?: () => void): ReplayTransport => {
  const inner = inProcessReplay(queue);
  return {
    route: (q, c) => inner.route(q, c),
    publishReplay: async (q, c, body) => {
      onPublish?.();
      published.push({ queue: q, consumer: c, body, envelope: JSON.parse(Buffer.from(body).toString("utf8")) });
      return inner.publishReplay(q, c, body);
    },
  };
};
let metrics: { replayed: number; failedAgain: number };

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  broken.clear();
  queue = createMemoryQueue({ concurrency: 4 });
  queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
  published = [];
  metrics = { replayed: 0, failedAgain: 0 };
  ops = createOps({
    db: pg.db,
    replay: recordingReplay(),
    metrics: {
      replayed: () => {
        metrics.replayed += 1;
      },
      failedAgain: (n) => {
        metrics.failedAgain += n;
      },
    },
    batchPolicy: { approvalThreshold: 5, pollIntervalMs: 20, sampleTimeoutMs: 5_000 },
  });
});
afterEach(async () => {
  await queue.close();
});

const award = (customerId: string, points = 10, tenantId = "acme") =>
  createEnvelope({ tenantId, kind: "points.award.v1", data: { customerId, points } });

/** Jobs for broken customers, each delivered until it became a dead letter; the letters' ids in order. */
const makeDeadLetters = (envelopes: Envelope[]) =>
  publishToDeadLetters({ db: pg.db, queue, queueName: QUEUE, broken }, envelopes);
const effectsOf = async (jobId: string) =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects where job_id = ${jobId}`)[0]?.n;
const letter = async (id: string) => (await pg.db.select().from(deadLetters).where(eq(deadLetters.id, id)))[0];
async function expectOpsError(promise: Promise<unknown>, code: string, message: RegExp) {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isSoftcrumError(error), `expected an OpsError ${code}, got ${String(error)}`).toBe(true);
  expect((error as { code: string }).code).toBe(code);
  expect((error as Error).message).toMatch(message);
}

describe("finding dead letters", () => {
  test("list filters by queue, consumer, tenant, kind, class, status and time, and pages with a cursor both ways", async () => {
    const ids = await makeDeadLetters([
      award("a1", 1, "acme"),
      award("a2", 2, "globex"),
      award("a3", 3, "acme"),
      award("a4", 4, "acme"),
    ]);
    await queue.publishRaw(QUEUE, "not json");
    await queue.drain();

    expect(await ops.deadLetters.count()).toBe(5);
    expect(await ops.deadLetters.count({ tenantId: "acme" })).toBe(3);
    expect(await ops.deadLetters.count({ errorClass: "poison" })).toBe(1);
    expect(
      await ops.deadLetters.count({
        queue: QUEUE,
        consumer: "ops.award",
        kind: "points.award.v1",
        errorClass: "permanent",
      }),
    ).toBe(4);
    expect(await ops.deadLetters.count({ createdAfter: new Date(Date.now() + 60_000) })).toBe(0);
    expect(await ops.deadLetters.count({ status: "discarded" })).toBe(0);

    const first = await ops.deadLetters.list({ tenantId: "acme" }, { limit: 2, order: "oldest" });
    expect(first.items.map((i) => i.id)).toEqual([ids[0], ids[2]]);
    expect(first.items[0]).not.toHaveProperty("payload");
    const second = await ops.deadLetters.list(
      { tenantId: "acme" },
      { limit: 2, order: "oldest", cursor: first.nextCursor ?? "" },
    );
    expect(second.items.map((i) => i.id)).toEqual([ids[3]]);
    expect(second.nextCursor).toBeNull();
    const newest = await ops.deadLetters.list({ tenantId: "acme" }, { limit: 10 });
    expect(newest.items.map((i) => i.id)).toEqual([ids[3], ids[2], ids[0]]);
  });

  test.each([
    [{ errorClass: "nope" }, /errorClass/],
    [{ status: "gone" }, /status/],
    [{ createdAfter: "yesterday-ish" }, /createdAfter: must be a date/],
    [
      { createdAfter: "2026-02-01T00:00:00Z", createdBefore: "2026-01-01T00:00:00Z" },
      /createdAfter must be before createdBefore/,
    ],
    [{ createdAfter: "2026-02-01T08:00" }, /createdAfter: must be a date\/time \(ISO 8601 with an offset/],
    [{ tenant: "acme" }, /unrecognized key.*tenant/i],
  ])("a bad filter %j is refused with INVALID_INPUT naming the problem", async (filter, message) => {
    await expectOpsError(ops.deadLetters.list(filter as never), "INVALID_INPUT", message);
  });

  test("get returns the payload as received, the envelope, related letters and the audit history; unknown ids are NOT_FOUND", async () => {
    const envelope = award("g1");
    const [id] = await makeDeadLetters([envelope]);
    await ops.deadLetters.discard([id as string], { operator: "ana", reason: "customer closed for good" });
    const detail = await ops.deadLetters.get(id as string);
    expect(JSON.parse(detail.payloadText)).toEqual(envelope);
    expect(detail.envelope).toEqual(envelope);
    expect(detail.history).toEqual([
      expect.objectContaining({ operator: "ana", action: "dead_letter.discard", result: "ok" }),
    ]);
    expect(detail.related).toEqual([]);
    await expectOpsError(ops.deadLetters.get("0190b3c4-0000-7000-8000-000000000000"), "NOT_FOUND", /no dead letter/);
    await expectOpsError(ops.deadLetters.get("nope"), "INVALID_INPUT", /must be a dead-letter id/);
  });
});

describe("discard", () => {
  test("records who, when and why, and only pending letters change", async () => {
    const [id] = await makeDeadLetters([award("d1")]);
    const report = await ops.deadLetters.discard([id as string, "0190b3c4-0000-7000-8000-000000000000"], {
      operator: "ana",
      reason: "test data",
    });
    expect(report.counts).toEqual({ discarded: 1, not_found: 1 });
    expect(await letter(id as string)).toMatchObject({
      status: "discarded",
      statusChangedBy: "ana",
      statusReason: "test data",
    });
    expect((await letter(id as string))?.statusChangedAt).toBeInstanceOf(Date);
    const again = await ops.deadLetters.discard([id as string], { operator: "bo", reason: "again" });
    expect(again.results[0]).toMatchObject({ outcome: "not_pending", detail: "status is discarded" });
  });

  test.each(["", "   "])("without a reason (%j) is rejected by the API, and audited as rejected", async (reason) => {
    const [id] = await makeDeadLetters([award("d2")]);
    await expectOpsError(
      ops.deadLetters.discard([id as string], { operator: "ana", reason }),
      "INVALID_INPUT",
      /non-empty reason/,
    );
    expect((await letter(id as string))?.status).toBe("pending_review");
    const audit = await pg.sql`select operator, action, result from core.ops_audit`;
    expect(audit).toEqual([{ operator: "ana", action: "dead_letter.discard", result: "rejected" }]);
  });

  test.each([null, "", "  "])("without a reason (%j) is rejected by the database too", async (reason) => {
    const [id] = await makeDeadLetters([award("d3")]);
    await expect(
      pg.db
        .update(deadLetters)
        .set({ status: "discarded", statusReason: reason, statusChangedAt: new Date(), statusChangedBy: "sql" })
        .where(eq(deadLetters.id, id as string)),
    ).rejects.toMatchObject({
      cause: expect.objectContaining({ constraint_name: "dead_letters_discard_reason_not_blank" }),
    });
  });
});

describe("replay", () => {
  test("after the fix, replay applies the job once with the same job_id and marks the letter replayed", async () => {
    const envelope = award("r1", 70);
    const [id] = await makeDeadLetters([envelope]);
    broken.clear(); // the fix is deployed
    const report = await ops.deadLetters.replay([id as string], { operator: "ana", reason: "partner fixed" });
    await queue.drain();
    expect(report.counts).toEqual({ replayed: 1 });
    // The original bytes, addressed to the letter's consumer.
    expect(published).toEqual([{ queue: QUEUE, consumer: "ops.award", body: JSON.stringify(envelope), envelope }]);
    expect(await effectsOf(envelope.job_id)).toBe(1);
    expect(await letter(id as string)).toMatchObject({
      status: "replayed",
      statusChangedBy: "ana",
      statusReason: "partner fixed",
    });

    // Replaying again is refused (not pending), and even a republish would be a duplicate.
    expect((await ops.deadLetters.replay([id as string], { operator: "ana", reason: "again" })).counts).toEqual({
      not_pending: 1,
    });
    await queue.publish(QUEUE, envelope);
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
  });

  test("a copy of a dead-lettered job that arrives before the replay does not run: the letter owns the job, the replay applies it once (#8 item 3)", async () => {
    const envelope = award("r2", 5);
    const [id] = await makeDeadLetters([envelope]); // first delivery: rejected, dead-lettered
    broken.clear();
    await queue.publish(QUEUE, envelope); // an at-least-once copy arrives after the fix
    await queue.drain();
    // Never a committed fence beside a pending letter.
    expect(await effectsOf(envelope.job_id)).toBe(0);
    expect((await letter(id as string))?.status).toBe("pending_review");

    await ops.deadLetters.replay([id as string], { operator: "ana", reason: "sweep" });
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
    await queue.publish(QUEUE, envelope); // and a late copy after the replay is a duplicate
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
  });

  test("a replay is not swallowed by a transport dedup key the producer used", async () => {
    broken.add("r3");
    const envelope = award("r3");
    // The producer used the job_id as the transport's dedup key (24 h window in the memory adapter).
    await queue.publish(QUEUE, envelope, { idempotencyKey: envelope.job_id });
    await queue.drain();
    const [row] = await pg.db.select({ id: deadLetters.id }).from(deadLetters);
    broken.clear();
    await ops.deadLetters.replay([row?.id as string], { operator: "ana", reason: "fixed" });
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
  });

  test("a replayed job that fails again makes a new dead letter in the replay view; the old one stays replayed", async () => {
    const envelope = award("r4");
    const [id] = await makeDeadLetters([envelope]); // still broken: the fix did not work
    await ops.deadLetters.replay([id as string], { operator: "ana", reason: "try" });
    await queue.drain();
    expect((await letter(id as string))?.status).toBe("replayed");
    const again = (await ops.deadLetters.failedAfterReplay()).items;
    expect(again).toHaveLength(1);
    expect(again[0]).toMatchObject({
      jobId: envelope.job_id,
      status: "pending_review",
      replayedFrom: id,
      batchId: null,
    });
    expect((await ops.deadLetters.get(id as string)).related.map((r) => r.id)).toEqual([again[0]?.id]);
  });

  test("two operators replaying the same letter at once publish it once", async () => {
    const [id] = await makeDeadLetters([award("r5")]);
    broken.clear();
    const other = createOps({
      db: pg.connect({ max: 2 }).db,
      replay: recordingReplay(),
    });
    const [a, b] = await Promise.all([
      ops.deadLetters.replay([id as string], { operator: "ana", reason: "x" }),
      other.deadLetters.replay([id as string], { operator: "bo", reason: "y" }),
    ]);
    await queue.drain();
    expect([a.counts, b.counts]).toEqual(expect.arrayContaining([{ replayed: 1 }, { not_pending: 1 }]));
    expect(published).toHaveLength(1);
  });

  test("a letter whose payload is not an envelope cannot be replayed; it stays pending for a discard", async () => {
    await queue.publishRaw(QUEUE, "{broken");
    await queue.drain();
    const [row] = await pg.db.select({ id: deadLetters.id }).from(deadLetters);
    const report = await ops.deadLetters.replay([row?.id as string], { operator: "ana", reason: "x" });
    expect(report.results[0]).toMatchObject({
      outcome: "not_replayable",
      detail: expect.stringMatching(/not JSON.*discard/),
    });
    expect(published).toHaveLength(0);
  });

  test("a publish that fails leaves the letter pending", async () => {
    const [id] = await makeDeadLetters([award("r6")]);
    const failing = createOps({
      db: pg.db,
      replay: { route: () => ({ ok: true }), publishReplay: async () => Promise.reject(new Error("queue down")) },
    });
    const report = await failing.deadLetters.replay([id as string], { operator: "ana", reason: "x" });
    expect(report.results[0]).toMatchObject({ outcome: "failed", detail: expect.stringContaining("queue down") });
    expect((await letter(id as string))?.status).toBe("pending_review");
  });

  test("depth reports pending letters and the oldest age per queue and consumer", async () => {
    await makeDeadLetters([award("p1"), award("p2")]);
    const [row] = await ops.deadLetters.depth();
    expect(row).toMatchObject({ queue: QUEUE, consumer: "ops.award", pending: 2 });
    expect(row?.oldestPendingAgeMs).toBeGreaterThanOrEqual(0);
  });

  test("every mutating call is audited with operator, action, scope and result", async () => {
    const [id] = await makeDeadLetters([award("au1")]);
    await ops.deadLetters.discard([id as string], { operator: "ana", reason: "dup" });
    await ops.deadLetters.discard([id as string], { operator: "", reason: "dup" }).catch(() => {});
    const rows = await pg.db.select().from(opsAudit).orderBy(opsAudit.at);
    expect(rows).toEqual([
      expect.objectContaining({
        operator: "ana",
        action: "dead_letter.discard",
        result: "ok",
        scope: { ids: [id], reason: "dup" },
      }),
      expect.objectContaining({ operator: "(none given)", action: "dead_letter.discard", result: "rejected" }),
    ]);
  });
});

describe("replay batches", () => {
  test("a batch replays only what its filter selected, at its rate limit, and completes", async () => {
    const acme = Array.from({ length: 8 }, (_, i) => award(`b-acme-${i}`, 1, "acme"));
    const globex = Array.from({ length: 3 }, (_, i) => award(`b-globex-${i}`, 1, "globex"));
    await makeDeadLetters([...acme, ...globex]);
    broken.clear();
    const created = await ops.batches.create({
      filter: { tenantId: "acme" },
      operator: "ana",
      reason: "partner fixed",
      ratePerSecond: 20,
      batchSize: 3,
      expiresInMinutes: 10,
    });
    expect(created).toMatchObject({ status: "awaiting_approval", selected: 8 }); // over the threshold of 5
    await ops.batches.approve(created.id, { operator: "bo" });

    const started = Date.now();
    const progress: number[] = [];
    const done = await ops.batches.run(created.id, {
      operator: "bo",
      onProgress: (p) => progress.push(p.batch.replayed),
    });
    const elapsed = Date.now() - started;
    await queue.drain();

    expect(done).toMatchObject({ status: "completed", replayed: 8, approvedBy: "bo", requestedBy: "ana" });
    expect(done.endedAt).toBeInstanceOf(Date);
    // 8 publishes at 20/s: the last goes out 7 × 50 ms after the first.
    expect(elapsed).toBeGreaterThanOrEqual(340);
    expect(progress.length).toBeGreaterThan(1);
    expect(published.map((p) => p.envelope.tenant_id)).toEqual(Array(8).fill("acme"));
    for (const e of acme) expect(await effectsOf(e.job_id)).toBe(1);
    for (const e of globex) expect(await effectsOf(e.job_id)).toBe(0);
    expect(await ops.deadLetters.count({ tenantId: "globex", status: "pending_review" })).toBe(3);
    expect((await ops.batches.get(created.id)).succeeded).toBe(8);
  });

  test("approval: a large batch does not run unapproved, and the requester cannot approve it", async () => {
    await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`ap-${i}`)));
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 });
    await expectOpsError(ops.batches.run(batch.id, { operator: "ana" }), "CONFLICT", /awaits approval/);
    await expectOpsError(ops.batches.approve(batch.id, { operator: "ana" }), "FORBIDDEN", /cannot approve it/);
    expect((await ops.batches.get(batch.id)).status).toBe("awaiting_approval");
    // The database refuses it too.
    await expect(
      pg.db.update(replayBatches).set({ approvedBy: "ana" }).where(eq(replayBatches.id, batch.id)),
    ).rejects.toMatchObject({
      cause: expect.objectContaining({ constraint_name: "replay_batches_approver_not_requester" }),
    });
  });

  test("a small batch needs no approval", async () => {
    await makeDeadLetters([award("small-1")]);
    expect((await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 })).status).toBe("ready");
  });

  test("an expired batch does not run", async () => {
    await makeDeadLetters([award("ex-1"), award("ex-2")]);
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 100,
      expiresAt: new Date(Date.now() + 150),
    });
    await new Promise((r) => setTimeout(r, 200));
    const after = await ops.batches.run(batch.id, { operator: "ana" });
    expect(after).toMatchObject({ status: "expired", replayed: 0, stopReason: "expired before it finished" });
    expect(published).toHaveLength(0);
  });

  test("a sample runs first; when its jobs succeed the batch continues to the end", async () => {
    const envelopes = Array.from({ length: 5 }, (_, i) => award(`s-ok-${i}`));
    await makeDeadLetters(envelopes);
    broken.clear();
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 200,
      sampleSize: 2,
      batchSize: 10,
    });
    const done = await ops.batches.run(batch.id, { operator: "ana" });
    expect(done).toMatchObject({ status: "completed", replayed: 5 });
    expect(done.samplePassedAt).toBeInstanceOf(Date);
  });

  test("a sample whose jobs fail again pauses the batch before the rest is replayed", async () => {
    const envelopes = Array.from({ length: 5 }, (_, i) => award(`s-bad-${i}`));
    await makeDeadLetters(envelopes);
    broken.delete("s-bad-2");
    broken.delete("s-bad-3");
    broken.delete("s-bad-4"); // the first two (the sample) still fail
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 200,
      sampleSize: 2,
      batchSize: 10,
    });
    const after = await ops.batches.run(batch.id, { operator: "ana" });
    // It pauses on the first sample job that fails again.
    expect(after).toMatchObject({ status: "paused", replayed: 2, pending: 3 });
    expect(after.stopReason).toMatch(/sample: [12] of 2 sample jobs failed again/);
    expect(published).toHaveLength(2);
    await queue.drain();
    expect((await ops.batches.get(batch.id)).failedAgain).toBe(2);
    const linked = (await ops.deadLetters.failedAfterReplay({ batchId: batch.id })).items;
    expect(linked.map((l) => l.batchId)).toEqual([batch.id, batch.id]);
  });

  test("the batch pauses itself when the failure rate of its replayed jobs crosses the threshold", async () => {
    const envelopes = Array.from({ length: 30 }, (_, i) => award(`fr-${i}`));
    await makeDeadLetters(envelopes);
    // Nothing is fixed: every replay fails again.
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 100,
      batchSize: 5,
      maxFailureRate: 0.5,
    });
    await ops.batches.approve(batch.id, { operator: "bo" });
    const after = await ops.batches.run(batch.id, { operator: "bo" });
    expect(after.status).toBe("paused");
    expect(after.stopReason).toMatch(/failure rate \d+% .* is over 50%/);
    expect(after.replayed).toBeLessThan(30);
    expect(metrics.replayed).toBe(after.replayed);
    expect(metrics.failedAgain).toBeGreaterThanOrEqual(5);
  });

  test("pause, resume and stop: a stopped batch never runs again", async () => {
    await makeDeadLetters(Array.from({ length: 4 }, (_, i) => award(`ps-${i}`)));
    broken.clear();
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100, batchSize: 1 });
    await ops.batches.pause(batch.id, { operator: "ana", reason: "wait for deploy" });
    await expectOpsError(ops.batches.run(batch.id, { operator: "ana" }), "CONFLICT", /is paused .*resume it first/);
    await ops.batches.resume(batch.id, { operator: "ana", reason: "deployed" });

    // Pausing from elsewhere while it runs stops the runner after the current chunk.
    const controller = new AbortController();
    const run = ops.batches.run(batch.id, {
      operator: "ana",
      onProgress: (p) => {
        if (p.batch.replayed === 2) controller.abort();
      },
      signal: controller.signal,
    });
    const paused = await run;
    expect(paused.status).toBe("paused");
    expect(paused.replayed).toBe(2);

    const stopped = await ops.batches.stop(batch.id, { operator: "bo", reason: "enough" });
    expect(stopped).toMatchObject({ status: "stopped", stopReason: "stopped by bo: enough" });
    expect((await ops.batches.run(batch.id, { operator: "ana" })).replayed).toBe(2);
    await expectOpsError(ops.batches.resume(batch.id, { operator: "ana", reason: "x" }), "CONFLICT", /is stopped/);
  });

  test("a filter that selects nothing, or a status filter, is refused", async () => {
    await expectOpsError(
      ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 1, filter: { tenantId: "none" } }),
      "INVALID_INPUT",
      /selects no pending/,
    );
    await expectOpsError(
      ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 0 }),
      "INVALID_INPUT",
      /ratePerSecond/,
    );
    await expectOpsError(
      ops.batches.create({ operator: "ana", reason: "", ratePerSecond: 1 }),
      "INVALID_INPUT",
      /reason/,
    );
    await expectOpsError(
      ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 1, filter: { status: "discarded" } }),
      "INVALID_INPUT",
      /drop filter.status/,
    );
  });

  test("two runners on one batch: the second is refused while the first holds the lease", async () => {
    await makeDeadLetters(Array.from({ length: 3 }, (_, i) => award(`lease-${i}`)));
    broken.clear();
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 10, batchSize: 1 });
    const first = ops.batches.run(batch.id, { operator: "ana" });
    await new Promise((r) => setTimeout(r, 50));
    await expectOpsError(ops.batches.run(batch.id, { operator: "bo" }), "CONFLICT", /being run by another runner/);
    expect((await first).status).toBe("completed");
    expect(published).toHaveLength(3);
  });

  test("batch counts come from the database: selected, replayed, failed again, succeeded", async () => {
    const envelopes = [award("c-ok"), award("c-bad")];
    await makeDeadLetters(envelopes);
    broken.delete("c-ok");
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 });
    await ops.batches.run(batch.id, { operator: "ana" });
    await queue.drain();
    const view = await ops.batches.get(batch.id);
    expect(view).toMatchObject({ selected: 2, replayed: 2, failedAgain: 1, succeeded: 1, unresolved: 0, pending: 0 });
    const [row] = await pg.db
      .select({ n: sql<number>`count(*)::int` })
      .from(opsAudit)
      .where(eq(opsAudit.action, "batch.run"));
    expect(row?.n).toBe(1);
  });
});

describe("review regressions", () => {
  test("a replay reaches only the letter's consumer, not another consumer of the queue whose letter was discarded", async () => {
    const otherEffects: string[] = [];
    const other = defineConsumer({
      name: "ops.other",
      queue: QUEUE,
      kind: "points.award.v1",
      schema: z.object({ customerId: z.string(), points: z.number() }),
      async handle(_data, { envelope }) {
        if (broken.has("other-down")) throw new PermanentError("other down");
        otherEffects.push(envelope.job_id);
      },
    });
    queue.subscribe(bindConsumer(other, { db: pg.db, logger: silentLogger }));
    broken.add("other-down");
    const envelope = award("fan-1");
    broken.add("fan-1");
    await queue.publish(QUEUE, envelope);
    await queue.drain();
    const rows = await pg.db.select({ id: deadLetters.id, consumer: deadLetters.consumer }).from(deadLetters);
    const mine = rows.find((r) => r.consumer === "ops.award")?.id as string;
    const theirs = rows.find((r) => r.consumer === "ops.other")?.id as string;
    await ops.deadLetters.discard([theirs], { operator: "ana", reason: "revoked for ops.other" });
    broken.clear();

    await ops.deadLetters.replay([mine], { operator: "ana", reason: "fixed" });
    await queue.drain();
    expect(await effectsOf(envelope.job_id)).toBe(1);
    expect(otherEffects).toEqual([]); // the discarded consumer never saw the replay
  });

  test("more letters than the direct-replay cap must go through a batch", async () => {
    const capped = createOps({ db: pg.db, replay: recordingReplay(), maxDirectReplay: 2 });
    const ids = await makeDeadLetters([award("cap-1"), award("cap-2"), award("cap-3")]);
    await expectOpsError(
      capped.deadLetters.replay(ids, { operator: "ana", reason: "x" }),
      "INVALID_INPUT",
      /create a replay batch/,
    );
    expect(published).toHaveLength(0);
  });

  test("a stop from another operator takes effect at the next letter, not at the end of the chunk", async () => {
    await makeDeadLetters(Array.from({ length: 12 }, (_, i) => award(`stop-${i}`)));
    broken.clear();
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 40, batchSize: 100 });
    await ops.batches.approve(batch.id, { operator: "bo" });
    const run = ops.batches.run(batch.id, { operator: "bo" });
    while (published.length < 3) await new Promise((r) => setTimeout(r, 5));
    await ops.batches.stop(batch.id, { operator: "ana", reason: "wrong filter" });
    const after = await run;
    expect(after.status).toBe("stopped");
    expect(published.length).toBeLessThanOrEqual(5);
    expect(after.pending).toBeGreaterThanOrEqual(7);
  });

  test("when a runner's lease lapses, runners take turns: every letter is published once and counted once", async () => {
    const leasing = createOps({ db: pg.db, replay: recordingReplay(), batchPolicy: { leaseMs: 1 } });
    await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`lease-x-${i}`)));
    broken.clear();
    const batch = await leasing.batches.create({ operator: "ana", reason: "x", ratePerSecond: 50, batchSize: 2 });
    // With a 1 ms lease the second runner can take the batch over from the first.
    await Promise.allSettled([
      leasing.batches.run(batch.id, { operator: "ana" }),
      new Promise((r) => setTimeout(r, 30)).then(() => leasing.batches.run(batch.id, { operator: "bo" })),
    ]);
    const ids = published.map((p) => p.envelope.job_id);
    expect(new Set(ids).size).toBe(ids.length);
    await queue.drain();
    const final = await ops.batches.get(batch.id);
    expect(final.replayed + final.pending).toBe(6);
    expect(final.replayed).toBe(ids.length);
    expect(final.skipped).toBe(0);
    expect(final.succeeded).toBe(final.replayed);
  });

  test("resuming after a pause that was not the sample's keeps the sample requirement", async () => {
    await makeDeadLetters(Array.from({ length: 5 }, (_, i) => award(`rs-${i}`)));
    // Still broken: the sample will fail.
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 100,
      sampleSize: 3,
      batchSize: 10,
    });
    await ops.batches.pause(batch.id, { operator: "ana", reason: "lunch" });
    const resumed = await ops.batches.resume(batch.id, { operator: "ana", reason: "back" });
    expect(resumed.samplePassedAt).toBeNull();
    const after = await ops.batches.run(batch.id, { operator: "ana" });
    expect(after).toMatchObject({ status: "paused", replayed: 3, pending: 2 });
    expect(after.stopReason).toMatch(/^sample:/);
  });

  test("after waiting for its sample, a batch keeps its pace instead of bursting", async () => {
    await makeDeadLetters(Array.from({ length: 6 }, (_, i) => award(`pace-${i}`)));
    broken.clear();
    const times: number[] = [];
    const timed = createOps({ db: pg.db, replay: recordingReplay(), batchPolicy: { pollIntervalMs: 150 } });
    // When each replay STARTS (#10 item 15): that is what the pace rule is
    // about; when its publish completes depends on the database's load.
    const replayOne = timed.deadLetters.replayOne.bind(timed.deadLetters);
    timed.deadLetters.replayOne = (...args) => {
      times.push(Date.now());
      return replayOne(...args);
    };
    const batch = await timed.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 20,
      sampleSize: 1,
      batchSize: 10,
    });
    const done = await timed.batches.run(batch.id, { operator: "ana" });
    expect(done.status).toBe("completed");
    expect(times).toHaveLength(6);
    // The wait for the sample earned no credit: the k-th replay after the
    // sample passed starts no earlier than k intervals (50 ms at 20/s) after
    // it, whatever the database's load (2 ms of timer rounding).
    const passed = (done.samplePassedAt as Date).getTime();
    for (let k = 1; k <= 5; k++) expect((times[k] as number) - passed).toBeGreaterThanOrEqual(k * 50 - 2);
  });

  test("a chain of replays lists each failure once, under the batch that replayed it", async () => {
    const [first] = await makeDeadLetters([award("chain-1")]);
    await ops.deadLetters.replay([first as string], { operator: "ana", reason: "try 1" });
    await queue.drain();
    const [second] = (await ops.deadLetters.failedAfterReplay()).items.map((l) => l.id);
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "try 2",
      ratePerSecond: 100,
      filter: { consumer: "ops.award" },
    });
    await ops.batches.run(batch.id, { operator: "ana" });
    await queue.drain();
    const listed = (await ops.deadLetters.failedAfterReplay()).items;
    expect(listed.map((l) => [l.replayedFrom, l.batchId])).toEqual([
      [first, null],
      [second, batch.id],
    ]);
    expect((await ops.batches.get(batch.id)).failedAgain).toBe(1);
    const history = (await ops.deadLetters.get(second as string)).history.map((h) => h.action);
    expect(history).toEqual(expect.arrayContaining(["batch.create", "batch.run"]));
  });
});
