/**
 * #21 items 1–6: the controls of a replay batch hold at every instant. A
 * stop, pause or expiry that lands while the runner waits for a letter's turn
 * stops that letter; `maxDurationMs` bounds the call, chunk included; rates
 * and sizes have bounds; the two-person rule counts replays when they
 * happen; every run request is audited.
 */
import { useTestDatabase } from "@softcrum/testing";
import { eq } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { awardConsumer, createEffectsTable, effects, silentLogger } from "../../test/fixtures.ts";
import { createMemoryQueue, type MemoryQueue } from "../adapters/memory/index.ts";
import { createManualClock } from "../clock.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { reportConsumerVersions } from "../db/consumer-versions.ts";
import { deadLetters, opsAudit } from "../db/schema.ts";
import { createEnvelope } from "../envelope.ts";
import { isSoftcrumError } from "../errors.ts";
import { sleep } from "../timers.ts";
import { type BatchRecoveryReport, createOps, type Ops, type SampleReport } from "./index.ts";
import { liveRatePerSecond, pacedRate } from "./pacing.ts";
import { type StrainRecorder, strainRecorder } from "./strain.ts";

const pg = useTestDatabase("batch-controls");
const QUEUE = "controls.points";
const CONSUMER = "controls.award";
const consumer = awardConsumer(CONSUMER, QUEUE, {});

let queue: MemoryQueue;
let ops: Ops;

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  queue = createMemoryQueue({ concurrency: 4 });
  queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
  ops = createOps({ db: pg.db, queue, batchPolicy: { approvalThreshold: 100, pollIntervalMs: 20 } });
});
afterEach(async () => {
  await queue.close();
});

/** `n` pending letters of the consumer, each a valid job that succeeds when replayed. */
async function pendingLetters(n: number, tenantId = "acme"): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = uuidv7();
    const envelope = createEnvelope({
      tenantId,
      kind: "points.award.v1",
      data: { customerId: `c-${i}`, points: 1 },
    });
    await pg.sql`insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${id}, ${envelope.job_id}, ${tenantId}, ${QUEUE}, ${CONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    ids.push(id);
  }
  return ids;
}
const replayedCount = async () =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters where status = 'replayed'`)[0]?.n ??
  0;
async function until(condition: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 2_000 && !(await condition()); i++) await sleep(10);
}
const refusal = async (work: Promise<unknown>) => {
  try {
    await work;
  } catch (error) {
    if (isSoftcrumError(error)) return error;
    throw error;
  }
  throw new Error("expected a refusal");
};
const audit = () => pg.db.select().from(opsAudit).orderBy(opsAudit.at, opsAudit.id);

describe("a control that lands while the runner waits for the next letter's turn (#21 item 1)", () => {
  test.each(["stop", "pause"] as const)("%s: no letter is replayed after it returns", async (control) => {
    await pendingLetters(5);
    // One letter every 2 s: the control lands in the wait for the second.
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 0.5, batchSize: 5 });
    const running = ops.batches.run(batch.id, { operator: "ana" });
    await until(async () => (await replayedCount()) >= 1);
    const input = { operator: "bo", reason: "wrong selection" };
    const after =
      control === "stop" ? await ops.batches.stop(batch.id, input) : await ops.batches.pause(batch.id, input);
    const atControl = await replayedCount();
    const view = await running;
    expect(view.status).toBe(control === "stop" ? "stopped" : "paused");
    expect(after.status).toBe(view.status);
    expect(atControl).toBeGreaterThanOrEqual(1);
    expect(await replayedCount()).toBe(atControl);
    expect(view.replayed).toBe(atControl);
  });

  test("expiry: no letter is claimed at or after the batch's expiresAt", async () => {
    await pendingLetters(4);
    const expiresAt = new Date(Date.now() + 3_000);
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 0.5,
      batchSize: 4,
      expiresAt,
    });
    const view = await ops.batches.run(batch.id, { operator: "ana" });
    expect(view.status).toBe("expired");
    const late = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters where status = 'replayed' and status_changed_at >= ${expiresAt.toISOString()}::timestamptz`;
    expect(late[0]?.n).toBe(0);
    expect(view.replayed).toBe(await replayedCount());
  });
});

describe("maxDurationMs bounds the call, the chunk in progress included (#21 item 2)", () => {
  test("at one letter per 5 s, a run of at most 500 ms replays nothing and leaves the batch to the next run", async () => {
    await pendingLetters(3);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 0.2, batchSize: 50 });
    const view = await ops.batches.run(batch.id, { operator: "ana", maxDurationMs: 500 });
    expect(view.replayed).toBe(0);
    expect(await replayedCount()).toBe(0);
    // Released: the next run (another request) takes the batch on.
    const after = await ops.batches.get(batch.id);
    expect(after.leaseOwner).toBeNull();
    expect(["ready", "running"]).toContain(after.status);
  });
});

describe("rates and sizes have bounds (#21 items 3 and 5)", () => {
  test.each([
    ["a rate below one replay per 1,000 s", { ratePerSecond: 1e-7 }],
    ["a rate above 1,000/s", { ratePerSecond: 5_000 }],
    ["a sample larger than any selection", { ratePerSecond: 1, sampleSize: 3e9 }],
    ["an expiry past 30 days", { ratePerSecond: 1, expiresAt: new Date(Date.now() + 31 * 86_400_000) }],
  ])("%s is INVALID_INPUT, audited, and no batch is made", async (_label, input) => {
    await pendingLetters(2);
    const error = await refusal(ops.batches.create({ operator: "ana", reason: "x", ...input }));
    expect(error.code).toBe("INVALID_INPUT");
    expect(await pg.sql`select 1 from core.replay_batches`).toHaveLength(0);
    expect((await audit()).at(-1)).toMatchObject({ action: "batch.create", result: "rejected" });
  });
});

describe("the two-person rule counts replays when they happen (#21 item 4)", () => {
  test("a batch created outside the window runs beside a new one: together they never publish past the threshold unapproved", async () => {
    ops = createOps({
      db: pg.db,
      queue,
      batchPolicy: { approvalThreshold: 3, approvalWindowMs: 3_000, pollIntervalMs: 20 },
    });
    await pendingLetters(3, "acme");
    await pendingLetters(3, "beta");
    const a = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 100,
      filter: { tenantId: "acme" },
    });
    expect(a.status).toBe("ready");
    await sleep(3_100); // a's creation leaves the window; it has replayed nothing yet
    const b = await ops.batches.create({
      operator: "ana",
      reason: "y",
      ratePerSecond: 100,
      filter: { tenantId: "beta" },
    });
    await ops.batches.run(a.id, { operator: "ana" });
    await ops.batches.run(b.id, { operator: "ana" }).catch((error: unknown) => {
      if (!isSoftcrumError(error, "CONFLICT")) throw error;
    });
    expect(await replayedCount()).toBe(3);
    expect((await ops.batches.get(b.id)).status).toBe("awaiting_approval");
    // Approved by someone else, it runs.
    await ops.batches.approve(b.id, { operator: "bo" });
    expect((await ops.batches.run(b.id, { operator: "bo" })).status).toBe("completed");
    expect(await replayedCount()).toBe(6);
  });
});

describe("every run request is audited (#21 item 6)", () => {
  test("running an expired batch, and a stopped one, each leave an audit row", async () => {
    await pendingLetters(2);
    const expiring = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 1,
      expiresAt: new Date(Date.now() + 200),
    });
    await sleep(250);
    expect((await ops.batches.run(expiring.id, { operator: "ana" })).status).toBe("expired");
    const stopped = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 1 });
    await ops.batches.stop(stopped.id, { operator: "ana", reason: "no" });
    expect((await ops.batches.run(stopped.id, { operator: "bo" })).status).toBe("stopped");
    const runs = (await audit()).filter((row) => row.action === "batch.run");
    expect(runs).toEqual([
      expect.objectContaining({
        operator: "ana",
        scope: { batchId: expiring.id },
        detail: expect.stringMatching(/expired/),
      }),
      expect.objectContaining({
        operator: "bo",
        scope: { batchId: stopped.id },
        detail: expect.stringMatching(/stopped/),
      }),
    ]);
  });
});

// Keep the imports honest: the letters' effects are the consumer's rows.
test("a replayed letter's job runs once (sanity for the fixtures above)", async () => {
  const [id] = await pendingLetters(1);
  await ops.deadLetters.replay([id as string], { operator: "ana", reason: "x" });
  await queue.drain();
  expect(await pg.db.select().from(effects).where(eq(effects.consumer, CONSUMER))).toHaveLength(1);
  expect((await pg.db.select().from(deadLetters))[0]?.status).toBe("replayed");
});

describe("duplicates and the recovery proof (#21 items 5 and 7)", () => {
  test("replays whose jobs were already done pause the batch on the duplicate rate (audited), and are counted apart from successes", async () => {
    const ids = await pendingLetters(20);
    // Their jobs' fences exist from before: the work was done, the letters are wrong.
    await pg.sql`insert into core.processed_jobs (job_id, consumer, processed_at)
      select job_id::uuid, consumer, now() - interval '1 hour' from core.dead_letters where id in ${pg.sql(ids)}`;
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 20, batchSize: 2 });
    const view = await ops.batches.run(batch.id, { operator: "ana" });
    await queue.drain();
    expect(view.status).toBe("paused");
    expect(view.stopReason).toMatch(/^duplicate rate 100%/);
    expect(view.replayed).toBeLessThan(20);
    const after = await ops.batches.get(batch.id);
    expect(after.duplicates).toBe(after.replayed);
    expect(after.succeeded).toBe(0);
    expect(after.recovered).toBe(false); // letters are left to replay
    expect((await audit()).filter((row) => row.action === "batch.pause")).toEqual([
      expect.objectContaining({ scope: { batchId: batch.id, automatic: true, cause: "duplicate_rate" } }),
    ]);
    expect(await pg.db.select().from(effects)).toHaveLength(0);
  });

  test("a finished batch is recovered only when every replayed job resolved, with its time to recovery", async () => {
    await pendingLetters(4);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 });
    const ran = await ops.batches.run(batch.id, { operator: "ana" });
    expect(ran.replayed).toBe(4);
    await queue.drain();
    const view = await ops.batches.get(batch.id);
    expect(view).toMatchObject({ status: "completed", succeeded: 4, duplicates: 0, failedAgain: 0, unresolved: 0 });
    expect(view.recovered).toBe(true);
    expect(view.timeToRecoveryMs).toBeGreaterThanOrEqual(0);
  });
});

describe("pacing as a share of live traffic (#21 item 5)", () => {
  /** `n` live fences of `consumerName`, spread over the last `seconds` (database time). */
  const liveFences = (consumerName: string, n: number, seconds: number) =>
    pg.sql`insert into core.processed_jobs (job_id, consumer, processed_at)
      select gen_random_uuid(), ${consumerName}, now() - make_interval(secs => ${seconds} * g / ${n}::float8)
      from generate_series(1, ${n}) g`;

  test("the live rate counts the consumers' fences of the last minute, not other consumers', not replays'", async () => {
    await liveFences(CONSUMER, 600, 55); // 10/s
    await liveFences("controls.other", 6_000, 55);
    await liveFences(CONSUMER, 300, 3_600); // spread over an hour: ~5 in the window
    const live = await liveRatePerSecond(pg.db, [CONSUMER]);
    expect(live).toBeGreaterThan(9.9);
    expect(live).toBeLessThan(10.5);
    expect(await liveRatePerSecond(pg.db, [])).toBe(0);
    expect(pacedRate(0.1, 10, 0.5, 100)).toBe(1);
    expect(pacedRate(0.1, 1, 0.5, 100)).toBe(0.5);
    expect(pacedRate(0.5, 1_000, 0.5, 100)).toBe(100);
  });

  test("a batch at 50 % of a 10/s consumer paces at about 5/s, re-measured at every chunk; with no live traffic, at its floor", async () => {
    await pendingLetters(6);
    await liveFences(CONSUMER, 600, 55);
    const paced: number[] = [];
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 50,
      rateShareOfLive: 0.5,
      rateFloorPerSecond: 0.2,
      batchSize: 2,
    });
    expect(batch).toMatchObject({ rateShare: 0.5, rateFloor: 0.2, ratePerSecond: 50 });
    const view = await ops.batches.run(batch.id, { operator: "ana", onProgress: (p) => paced.push(p.pacedPerSecond) });
    expect(view.status).toBe("completed");
    expect(paced.length).toBeGreaterThanOrEqual(3);
    for (const rate of paced) {
      expect(rate).toBeGreaterThan(4.5);
      expect(rate).toBeLessThanOrEqual(5.3);
    }

    await pg.sql`truncate core.processed_jobs`;
    await pendingLetters(1);
    const idle: number[] = [];
    const quiet = await ops.batches.create({ operator: "ana", reason: "y", ratePerSecond: 50, rateShareOfLive: 0.5 });
    await ops.batches.run(quiet.id, {
      operator: "ana",
      maxDurationMs: 100,
      onProgress: (p) => idle.push(p.pacedPerSecond),
    });
    expect(idle.length).toBeGreaterThanOrEqual(1);
    expect(idle.every((rate) => rate === 0.1)).toBe(true);
  });

  test("a floor without a share, or a floor above the ceiling, is INVALID_INPUT", async () => {
    await pendingLetters(1);
    for (const input of [
      { ratePerSecond: 5, rateFloorPerSecond: 1 },
      { ratePerSecond: 5, rateShareOfLive: 0.1, rateFloorPerSecond: 10 },
      { ratePerSecond: 5, rateShareOfLive: 1.5 },
    ]) {
      expect((await refusal(ops.batches.create({ operator: "ana", reason: "x", ...input }))).code).toBe(
        "INVALID_INPUT",
      );
    }
  });
});

describe("a batch runs only against the consumer version it was made and approved for (#21 item 6)", () => {
  const VQUEUE = "controls.versioned";
  const VCONSUMER = "controls.versioned-award";
  /** Reports `deployAfterFirst` as its version once its first job committed: a deploy mid-batch. */
  let deployAfterFirst: string | undefined;
  const versioned = defineConsumer({
    name: VCONSUMER,
    queue: VQUEUE,
    kind: ["points.award.v1", "points.award.v2"],
    schema: z.object({ customerId: z.string(), points: z.number() }),
    async handle(data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: VCONSUMER, amount: data.points });
      if (deployAfterFirst) {
        const version = deployAfterFirst;
        deployAfterFirst = undefined;
        // On its own connection, committed before this job settles: the chunk's end sees it.
        await reportConsumerVersions(pg.db, [versioned], version);
      }
    },
  });
  async function versionedLetters(n: number): Promise<void> {
    for (let i = 0; i < n; i++) {
      const envelope = createEnvelope({
        tenantId: "acme",
        kind: "points.award.v1",
        data: { customerId: `v-${i}`, points: 1 },
      });
      await pg.sql`insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${uuidv7()}, ${envelope.job_id}, 'acme', ${VQUEUE}, ${VCONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    }
  }
  beforeEach(async () => {
    await pg.sql`truncate core.consumer_versions`;
    queue.subscribe(bindConsumer(versioned, { db: pg.db, logger: silentLogger }));
    deployAfterFirst = undefined;
  });

  test("the versions are recorded when the batch is made; another version refuses the run, audited", async () => {
    await reportConsumerVersions(pg.db, [versioned], "build-1");
    await versionedLetters(2);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 50 });
    expect(batch.consumerVersions).toEqual({
      [`${VQUEUE} ${VCONSUMER}`]: { version: "build-1", kinds: ["points.award.v1", "points.award.v2"] },
    });
    await reportConsumerVersions(pg.db, [versioned], "build-2");
    const refused = await refusal(ops.batches.run(batch.id, { operator: "ana" }));
    expect(refused?.code).toBe("CONFLICT");
    expect(refused?.message).toMatch(/runs version build-2, not build-1 the batch was made and approved for/);
    expect((await ops.batches.get(batch.id)).status).toBe("ready");
    expect(await replayedCount()).toBe(0);
    const [audited] = await pg.db.select().from(opsAudit).where(eq(opsAudit.action, "batch.run"));
    expect(audited).toMatchObject({ result: "rejected", detail: expect.stringMatching(/build-2/) });
    // Back on the version it was approved for, it runs.
    await reportConsumerVersions(pg.db, [versioned], "build-1");
    expect(await ops.batches.run(batch.id, { operator: "ana" })).toMatchObject({ status: "completed", replayed: 2 });
  });

  test("a deploy mid-batch pauses it at the end of the chunk, with the reason, audited", async () => {
    await reportConsumerVersions(pg.db, [versioned], "build-1");
    await versionedLetters(6);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 50, batchSize: 2 });
    deployAfterFirst = "build-2";
    const ran = await ops.batches.run(batch.id, { operator: "ana" });
    expect(ran).toMatchObject({
      status: "paused",
      replayed: 2,
      stopReason: expect.stringMatching(/^consumer version changed: .* runs version build-2, not build-1/),
    });
    const pauses = await pg.db.select().from(opsAudit).where(eq(opsAudit.action, "batch.pause"));
    expect(pauses.map((p) => (p.scope as { cause?: string }).cause)).toEqual(["consumer_version"]);
  });

  test("a consumer that reports an invalid version is a configuration error", async () => {
    await expect(reportConsumerVersions(pg.db, [versioned], " ")).rejects.toThrow(/non-blank string/);
    await expect(reportConsumerVersions(pg.db, [versioned], "x".repeat(201))).rejects.toThrow(/at most 200/);
  });
});

describe("a dependency straining under a batch pauses it (#21 item 5)", () => {
  const SQUEUE = "controls.strained";
  const SCONSUMER = "controls.strained-award";
  /** Runs once, inside the first replayed job: what live traffic does to the dependency meanwhile. */
  let duringFirst: (() => void) | undefined;
  const strained = defineConsumer({
    name: SCONSUMER,
    queue: SQUEUE,
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    async handle(data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: SCONSUMER, amount: data.points });
      const hook = duringFirst;
      duringFirst = undefined;
      hook?.();
    },
  });
  const attributes = { queue: SQUEUE, consumer: SCONSUMER } as const;
  let recorder: StrainRecorder;
  async function strainedLetters(n: number): Promise<void> {
    for (let i = 0; i < n; i++) {
      const envelope = createEnvelope({
        tenantId: "acme",
        kind: "points.award.v1",
        data: { customerId: `s-${i}`, points: 1 },
      });
      await pg.sql`insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${uuidv7()}, ${envelope.job_id}, 'acme', ${SQUEUE}, ${SCONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    }
  }
  /** `n` live deliveries as the consumers' metrics report them: `limited` of them rate-limited, each handler run `ms`. */
  const live = (n: number, limited: number, ms: number) => {
    for (let i = 0; i < n; i++) {
      recorder.metrics.jobProcessed({ ...attributes, outcome: i < limited ? "rate_limited" : "success" });
      if (i >= limited) recorder.metrics.handlerDuration(ms, { ...attributes, outcome: "success" });
    }
  };
  beforeEach(() => {
    recorder = strainRecorder();
    queue.subscribe(bindConsumer(strained, { db: pg.db, logger: silentLogger, metrics: recorder.metrics }));
    ops = createOps({
      db: pg.db,
      queue,
      strain: recorder,
      batchPolicy: { approvalThreshold: 100, pollIntervalMs: 20 },
    });
    duringFirst = undefined;
  });
  const pauses = async () =>
    (await pg.db.select().from(opsAudit).where(eq(opsAudit.action, "batch.pause"))).map(
      (p) => (p.scope as { cause?: string }).cause,
    );

  test("rate-limited outcomes during the batch over 3 × the share before it: paused at the end of the chunk, audited", async () => {
    live(40, 0, 5);
    await strainedLetters(6);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 50, batchSize: 2 });
    expect(batch).toMatchObject({ maxRateLimitedMultiple: 3, maxLatencyMultiple: 3 });
    duringFirst = () => live(10, 10, 5);
    expect(await ops.batches.run(batch.id, { operator: "ana" })).toMatchObject({
      status: "paused",
      replayed: 2,
      stopReason: expect.stringMatching(/^dependency strain: 10 of 1\d deliveries rate-limited during the batch/),
    });
    expect(await pauses()).toEqual(["dependency_strain"]);
  });

  test("handler p95 during the batch over 3 × the p95 before it: paused", async () => {
    live(30, 0, 5);
    await strainedLetters(6);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 50, batchSize: 2 });
    duringFirst = () => live(30, 0, 100);
    expect(await ops.batches.run(batch.id, { operator: "ana" })).toMatchObject({
      status: "paused",
      replayed: 2,
      stopReason: expect.stringMatching(/^dependency strain: handler p95 100 ms during the batch, over 3 × the 5 ms/),
    });
    expect(await pauses()).toEqual(["dependency_strain"]);
  });

  test("the thresholds are the batch's own: the same strain under a batch allowing 100 × completes", async () => {
    live(40, 4, 5);
    await strainedLetters(6);
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "x",
      ratePerSecond: 50,
      batchSize: 2,
      maxRateLimitedMultiple: 100,
      maxLatencyMultiple: 100,
    });
    duringFirst = () => live(12, 10, 100);
    expect(await ops.batches.run(batch.id, { operator: "ana" })).toMatchObject({ status: "completed", replayed: 6 });
    expect(await pauses()).toEqual([]);
    // Out of their bounds: bad input.
    const refused = await refusal(
      ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 1, maxLatencyMultiple: 0.5 }),
    );
    expect(refused?.code).toBe("INVALID_INPUT");
  });
});

describe("a batch's lease runs on the database's clock (#21 item 10)", () => {
  test("a runner whose clock is ten minutes ahead cannot take over a lease the database says is held", async () => {
    await pendingLetters(3);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 2, batchSize: 1 });
    const first = ops.batches.run(batch.id, { operator: "ana" });
    await until(async () => (await ops.batches.get(batch.id)).leaseOwner !== null);
    const ahead = createOps({
      db: pg.db,
      queue,
      clock: createManualClock(Date.now() + 10 * 60_000),
      batchPolicy: { approvalThreshold: 100 },
    });
    const refused = await refusal(ahead.batches.run(batch.id, { operator: "bo" }));
    expect(refused?.code).toBe("CONFLICT");
    expect(refused?.message).toMatch(/being run by another runner \(ana@/);
    expect(await first).toMatchObject({ status: "completed", replayed: 3, skipped: 0 });
  });
});

describe("the recovery report is a metric per batch (#21 item 7)", () => {
  /**
   * Holds every UPDATE that sets a batch's status (its lease, its completion)
   * 300 ms before it touches the row, so the run's last writes and its
   * report could overtake the completion, were it not awaited.
   */
  async function slowStatusChanges() {
    await pg.sql.unsafe(`create or replace function public.zz_slow_status() returns trigger language plpgsql as $$
      begin perform pg_sleep(0.3); return null; end $$`);
    await pg.sql.unsafe(`create trigger zz_slow_status before update of status on core.replay_batches
      for each statement execute function public.zz_slow_status()`);
    return () => pg.sql.unsafe("drop trigger zz_slow_status on core.replay_batches");
  }

  test.each([
    ["", async () => async () => {}],
    [", however late its completion reaches the database", slowStatusChanges],
  ])("each run reports what the batch replayed and what became of it%s", async (_, setUp) => {
    const tearDown = await setUp();
    try {
      await reportsWhatBecameOfIt();
    } finally {
      await tearDown();
    }
  });

  async function reportsWhatBecameOfIt() {
    await pendingLetters(3);
    const reports: BatchRecoveryReport[] = [];
    const reporting = createOps({
      db: pg.db,
      queue,
      metrics: { replayed() {}, failedAgain() {}, batchRecovery: (r) => reports.push(r) },
      batchPolicy: { approvalThreshold: 100 },
    });
    const batch = await reporting.batches.create({ operator: "ana", reason: "x", ratePerSecond: 100 });
    const done = await reporting.batches.run(batch.id, { operator: "ana" });
    expect(done.recovered).toBe(true);
    expect(reports).toEqual([
      {
        batchId: batch.id,
        status: "completed",
        replayed: 3,
        succeeded: 3,
        failedAgain: 0,
        inFlight: 0,
        duplicates: 0,
        timeToRecoveryMs: done.timeToRecoveryMs,
      },
    ]);
    expect(reports[0]?.timeToRecoveryMs).toEqual(expect.any(Number));
  }
});

describe("the sample step (#21 item 7)", () => {
  test("the sample's outcomes are shown beside the selection's classes before it goes on; a no pauses it, resuming accepts the sample (#21 item 7)", async () => {
    await pendingLetters(5);
    const batch = await ops.batches.create({ operator: "ana", reason: "x", ratePerSecond: 200, sampleSize: 2 });
    const reports: SampleReport[] = [];
    const paused = await ops.batches.run(batch.id, {
      operator: "ana",
      confirmSample: async (report) => {
        reports.push(report);
        return false;
      },
    });
    expect(paused).toMatchObject({ status: "paused", replayed: 2, pending: 3 });
    expect(paused.stopReason).toMatch(
      /^sample: 2 of 2 sample jobs resolved without failing again; reviewed, not continued/,
    );
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ batchId: batch.id, selection: { exhausted: 5 }, remaining: 3 });
    expect(reports[0]?.items.map((i) => [i.errorClass, i.outcome])).toEqual([
      ["exhausted", "succeeded"],
      ["exhausted", "succeeded"],
    ]);
    // Resuming is the decision to go on: the sample is not asked about again.
    await ops.batches.resume(batch.id, { operator: "ana", reason: "sample reviewed" });
    const done = await ops.batches.run(batch.id, {
      operator: "ana",
      confirmSample: async (report) => {
        reports.push(report);
        return false;
      },
    });
    expect(done).toMatchObject({ status: "completed", replayed: 5 });
    expect(reports).toHaveLength(1);
  });
});
