import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { PollingQueueClient } from "@vercel/queue";
import { eq } from "drizzle-orm";
import { afterEach, describe, expect, test } from "vitest";
import { TEST_QUEUE_SECRET } from "../../../test/fake-vercel-queues.ts";
import { effects, silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture, pointsSchema, random } from "../../../test/points-fixture.ts";
import { type VercelHarness, vercelHarness } from "../../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { processedJobs } from "../../db/schema.ts";
import { InvalidConfigError, PermanentError, RateLimitedError } from "../../errors.ts";
import { createOps } from "../../ops/index.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { DEFAULT_RETRY_POLICY, retryDelayMs } from "../../retry.ts";
import { createVercelQueue, fromVercelTopic, readVercelWrapper, toVercelTopic } from "./index.ts";

const pg = useEffectsDatabase("vercel");

const { pointsConsumer, rateLimitedConsumer, bind, effectRows, letters } = pointsFixture(pg, "vercel");

/** Acknowledgements and visibility changes, without the push route's lease confirmation (a PATCH to the full 300 s lease). */
const directives = (h: VercelHarness) =>
  h.fake.leaseCalls.filter((c) => !(c.method === "PATCH" && c.visibilityTimeoutSeconds === 300));
/** The JSON header of a wrapper the adapter sent (a deferral, a replay, a delayed message). */
const wrapperHead = (body: Buffer) => JSON.parse(body.subarray(0, body.indexOf(10)).toString("utf8"));
const text = (body: string | Uint8Array | undefined) =>
  typeof body === "string" ? body : Buffer.from(body ?? new Uint8Array()).toString("utf8");

let harness: VercelHarness | undefined;
afterEach(async () => {
  await harness?.close();
  harness = undefined;
});
const open = async (mode: "push" | "poll", options: Parameters<typeof vercelHarness>[1] = {}) => {
  harness = await vercelHarness(mode, options);
  return harness;
};

describe("names", () => {
  test("platform queue names map reversibly to Vercel topic names", () => {
    expect(toVercelTopic("notif.email.transactional")).toBe("notif_Demail_Dtransactional");
    expect(toVercelTopic("loyalty:points_v2-x")).toBe("loyalty_3Apoints__v2-x");
    for (const name of ["a", "a.b", "a_b", "a__b", "a._b", "a_.b", "_D", "a:b.c_d-e", "x_3A", "DD.__::"]) {
      const topic = toVercelTopic(name);
      expect(topic).toMatch(/^[A-Za-z0-9_-]+$/);
      expect(fromVercelTopic(topic)).toBe(name);
    }
    expect(toVercelTopic("a.b")).not.toBe(toVercelTopic("a_b"));
    expect(() => fromVercelTopic("a_Xb")).toThrow(InvalidConfigError);
  });

  test("a name that cannot be mapped is refused when binding a consumer or publishing to it", async () => {
    const h = await open("push");
    const bad: BoundConsumer = {
      name: "ok.name",
      queue: "mail/outbox",
      deliver: async () => ({ outcome: "success", ack: true }),
    };
    expect(() => h.queue.pushHandler(bad)).toThrow(InvalidConfigError);
    expect(() => h.queue.startWorker(bad)).toThrow(/cannot map "mail\/outbox"/);
    expect(() => h.queue.pushHandler({ ...bad, queue: "ok", name: "naïve" })).toThrow(InvalidConfigError);
    await expect(h.queue.publish("mail outbox", award())).rejects.toThrow(InvalidConfigError);
    expect(h.fake.sends).toHaveLength(0);
  });
});

describe("configuration", () => {
  test("missing region, credentials and deployment id are one clear error when the adapter is created", () => {
    let error: unknown;
    try {
      createVercelQueue({ env: {} });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidConfigError);
    const message = (error as Error).message;
    expect(message).toMatch(/region: pass options.region or set VERCEL_REGION/);
    expect(message).toMatch(/credentials: pass options.token, set VERCEL_OIDC_TOKEN/);
    expect(message).toMatch(/deployment: set VERCEL_DEPLOYMENT_ID/);
    expect(message).toMatch(
      /wrapperSecret: pass options.wrapperSecret or set SOFTCRUM_QUEUE_SECRET, at least 32 characters/,
    );
    expect(() =>
      createVercelQueue({ env: {}, region: "iad1", token: "t", deploymentId: null, wrapperSecret: "too short" }),
    ).toThrow(/wrapperSecret/);
    expect(() =>
      createVercelQueue({
        env: { VERCEL_REGION: "iad1", VERCEL_DEPLOYMENT_ID: "dpl_1", SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET },
      }),
    ).toThrow(/credentials/);
  });

  test("reads the region, OIDC token and deployment id from the environment Vercel sets", () => {
    const env = {
      VERCEL_REGION: "fra1",
      VERCEL_OIDC_TOKEN: "eyJ…",
      VERCEL_DEPLOYMENT_ID: "dpl_123",
      SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET,
    };
    expect(createVercelQueue({ env }).region).toBe("fra1");
    // Inside a Vercel Function the OIDC token comes with each request, not from the environment.
    expect(
      createVercelQueue({
        env: {
          VERCEL: "1",
          VERCEL_REGION: "iad1",
          VERCEL_DEPLOYMENT_ID: "d",
          SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET,
        },
      }).region,
    ).toBe("iad1");
    expect(
      createVercelQueue({ env: {}, region: "sfo1", token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET })
        .region,
    ).toBe("sfo1");
  });

  test("an invalid region or lease length is refused", () => {
    const base = { env: {}, token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET };
    expect(() => createVercelQueue({ ...base, region: "US East" })).toThrow(/not a Vercel region code/);
    expect(() => createVercelQueue({ ...base, region: "iad1", visibilityTimeoutSeconds: 5 })).toThrow(
      /visibilityTimeoutSeconds/,
    );
    expect(() => createVercelQueue({ ...base, region: "iad1", retentionSeconds: 700_000 })).toThrow(/retentionSeconds/);
  });

  test("a consumer whose handler time bound is not below the lease is refused where it is bound (#8 item 12)", async () => {
    const queue = createVercelQueue({
      env: {},
      region: "iad1",
      token: "t",
      deploymentId: null,
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    const consumer = bind(pointsConsumer());
    const slow = { name: consumer.name, queue: consumer.queue, timeoutMs: 300_000, deliver: consumer.deliver };
    expect(() => queue.pushHandler(slow)).toThrow(InvalidConfigError);
    expect(() => queue.startWorker(slow)).toThrow(/must be below the lease \(visibilityTimeoutSeconds 300 s\)/);
    await expect(queue.receiveAvailable(slow)).rejects.toThrow(InvalidConfigError);
    expect(() => queue.pushHandler({ ...slow, timeoutMs: 299_999 })).not.toThrow();
    await queue.close();
  });

  test("a bound consumer whose whole delivery (2 × timeoutMs + 5 s) is not below the lease is refused, though its timeoutMs is (#18 item 7)", async () => {
    const queue = createVercelQueue({
      env: {},
      region: "iad1",
      token: "t",
      deploymentId: null,
      visibilityTimeoutSeconds: 60,
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    const tooLong = bind({ ...pointsConsumer(), timeoutMs: 30_000 });
    expect(tooLong.deliveryBoundMs).toBe(65_000);
    expect(() => queue.pushHandler(tooLong)).toThrow(
      /deliveryBoundMs 65000: .*must be below the lease \(visibilityTimeoutSeconds 60 s\)/,
    );
    const fits = bind({ ...pointsConsumer(), timeoutMs: 27_000 });
    expect(() => queue.pushHandler(fits)).not.toThrow();
    await queue.close();
  });

  test("importing @softcrum/core does not load @vercel/queue", () => {
    // Walk the static import graph of the core's entry point.
    const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../index.ts");
    const seen = new Set<string>();
    const bare = new Set<string>();
    const visit = (file: string) => {
      if (seen.has(file)) return;
      seen.add(file);
      const source = readFileSync(file, "utf8");
      for (const [, spec] of source.matchAll(
        /(?:import|export)[^'"]*?from\s+["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g,
      )) {
        if (!spec) continue;
        if (spec.startsWith(".")) visit(resolve(dirname(file), spec));
        else bare.add(spec);
      }
    };
    visit(root);
    expect(seen.size).toBeGreaterThan(5);
    expect([...bare].filter((s) => s.startsWith("@vercel/"))).toEqual([]);
    expect([...seen].some((f) => f.includes("adapters/vercel"))).toBe(false);
  });
});

describe("publish and schedule", () => {
  test("publish never sets an idempotency key unless the caller passes one", async () => {
    const h = await open("push");
    await h.queue.publish("loyalty.points", award());
    await h.queue.publish("loyalty.points", award(), { idempotencyKey: "order-42" });
    expect(h.fake.sends.map((s) => [s.topic, s.idempotencyKey])).toEqual([
      ["loyalty_Dpoints", undefined],
      ["loyalty_Dpoints", "order-42"],
    ]);
  });

  test("every message asks for the longest retention; a delayed one carries its due time (#11 item 2)", async () => {
    const h = await open("push");
    const now = h.fake.clock.now();
    await h.queue.publish("loyalty.points", award());
    await h.queue.schedule("loyalty.points", award(), new Date(now + 5 * 86_400_000 + 400));
    await h.queue.schedule("loyalty.points", award(), new Date(now - 1));
    expect(h.fake.sends.map((s) => [s.delaySeconds, s.retentionSeconds])).toEqual([
      [undefined, 604_800],
      [432_001, 604_800],
      [undefined, 604_800],
    ]);
    expect(wrapperHead(h.fake.sends[1]?.body as Buffer)).toMatchObject({ due_at: now + 5 * 86_400_000 + 400 });
    expect(h.queue.transportHoldMs).toBe(604_800_000);
  });

  test("the retention is configurable and checked at creation, and the fence hold follows it (#11 item 2)", async () => {
    const base = { env: {}, region: "iad1", token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET };
    expect(() => createVercelQueue({ ...base, retentionSeconds: 700_000 })).toThrow(/retentionSeconds/);
    expect(() => createVercelQueue({ ...base, retentionSeconds: 86_400, deliveryWindowSeconds: 86_400 })).toThrow(
      /deliveryWindowSeconds/,
    );
    const day = createVercelQueue({ ...base, retentionSeconds: 86_400 });
    expect(day.transportHoldMs).toBe(86_400_000);
    await day.close();
    const h = await open("push", { retentionSeconds: 86_400 });
    await h.queue.schedule("loyalty.points", award(), new Date(h.fake.clock.now() + 10 * 3_600_000));
    expect(h.fake.sends[0]).toMatchObject({ delaySeconds: 36_000, retentionSeconds: 86_400 });
  });

  for (const mode of ["push", "poll"] as const) {
    test(`${mode}: schedule() weeks ahead travels in hops and runs once at runAt, never clamped (#11 item 2)`, async () => {
      const h = await open(mode);
      const seen: { at: number; deliveryCount: number; dueAt: number | undefined }[] = [];
      const consumer = bind(pointsConsumer());
      h.subscribe({
        ...consumer,
        name: consumer.name,
        queue: consumer.queue,
        maxAttempts: 5,
        deliver: async (delivery) => {
          seen.push({ at: h.fake.clock.now(), deliveryCount: delivery.deliveryCount, dueAt: delivery.dueAt });
          return consumer.deliver(delivery);
        },
      });
      const runAt = h.fake.clock.now() + 20 * 86_400_000 + 250;
      await h.queue.schedule(consumer.queue, award(), new Date(runAt));
      await h.settle(30 * 86_400_000);
      expect(seen).toEqual([{ at: runAt + 750, deliveryCount: 1, dueAt: runAt }]);
      // 20 days in hops of at most 6 (7-day retention less a day to deliver it), each a fresh message.
      expect(h.fake.sends.map((s) => s.delaySeconds)).toEqual([518_400, 518_400, 518_400, 172_801]);
      expect(h.fake.sends.every((s) => s.retentionSeconds === 604_800)).toBe(true);
      expect(await effectRows(consumer.name)).toHaveLength(1);
      expect(h.fake.drops).toEqual([]);
    });
  }
});

describe("push mode (route handler)", () => {
  test("a transient failure answers with a visibility change of the harness's backoff, and the retry then succeeds", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (ctx.attempt === 1) throw new Error("partner timeout");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.fake.dispatch();
    const backoff = Math.ceil(retryDelayMs(DEFAULT_RETRY_POLICY, 1, random) / 1000);
    expect(h.fake.leaseCalls.map((c) => [c.method, c.visibilityTimeoutSeconds, c.status])).toEqual([
      ["PATCH", 300, 200], // the route confirms its lease before running anything
      ["PATCH", backoff, 200],
    ]);
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([200]);
    await h.settle();
    expect(attempts).toEqual([1, 2]);
    expect(h.fake.leaseCalls.at(-1)).toMatchObject({ method: "DELETE", status: 204 });
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.pending(toVercelTopic(consumer.queue), h.fake.callbacks[0]?.group ?? "")).toBe(0);
  });

  test("poison and dead-lettered deliveries are acknowledged and leave a dead-letter row", async () => {
    const h = await open("push");
    const consumer = pointsConsumer((ctx) => {
      if (ctx.envelope.data && (ctx.envelope.data as { points: number }).points === 13) {
        throw new PermanentError("account closed");
      }
    });
    h.subscribe(bind(consumer));
    const topic = toVercelTopic(consumer.queue);
    h.fake.inject(topic, "not json at all");
    await h.queue.publish(consumer.queue, award(13));
    await h.fake.dispatch();
    expect(directives(h).map((c) => c.method)).toEqual(["DELETE", "DELETE"]);
    const rows = await letters(consumer.name);
    expect(rows.map((r) => r.errorClass).sort()).toEqual(["permanent", "poison"]);
    expect(rows.find((r) => r.errorClass === "poison")?.payload).toBe("not json at all");
    expect(h.fake.pending(topic, h.fake.callbacks[0]?.group ?? "")).toBe(0);
  });

  test("a dead-letter write failure is not acknowledged and comes back after the trigger's retry delay", async () => {
    await pg.sql.unsafe(`
      create or replace function test_refuse_dead_letters() returns trigger language plpgsql as
        $$ begin raise exception 'disk full (simulated)'; end $$;
      create trigger refuse_dead_letters before insert on core.dead_letters
        for each row execute function test_refuse_dead_letters();`);
    try {
      const h = await open("push", { retryAfterSeconds: 45 });
      const consumer = pointsConsumer();
      h.subscribe(bind(consumer));
      const topic = toVercelTopic(consumer.queue);
      const id = h.fake.inject(topic, "{broken");
      await h.fake.dispatch();
      const group = h.fake.callbacks[0]?.group ?? "";
      expect(h.fake.callbacks.map((c) => c.status)).toEqual([500]);
      // Not acknowledged: the lease is only set to end with the trigger's retry delay.
      expect(directives(h).map((c) => [c.method, c.visibilityTimeoutSeconds])).toEqual([["PATCH", 45]]);
      expect(h.fake.pending(topic, group)).toBe(1);
      expect(await letters(consumer.name)).toHaveLength(0);

      await pg.sql`drop trigger refuse_dead_letters on core.dead_letters`;
      h.fake.clock.advance(44_000);
      expect(await h.fake.dispatch()).toBe(0);
      h.fake.clock.advance(1_000);
      await h.fake.dispatch();
      expect(h.fake.callbacks.map((c) => [c.deliveryCount, c.status])).toEqual([
        [1, 500],
        [2, 200],
      ]);
      expect(h.fake.deliveryCount(topic, group, id)).toBe(2);
      expect((await letters(consumer.name)).map((r) => r.errorClass)).toEqual(["poison"]);
      expect(h.fake.pending(topic, group)).toBe(0);
    } finally {
      await pg.sql`drop trigger if exists refuse_dead_letters on core.dead_letters`;
    }
  });

  test("a rate-limited delivery is republished with its delay before the original is acknowledged, and stays attempt 1", async () => {
    const h = await open("push");
    const { consumer, attempts } = rateLimitedConsumer(2, "partner 429");
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    expect(attempts).toEqual([1, 1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(await letters(consumer.name)).toHaveLength(0);
    const [original, ...deferrals] = h.fake.sends;
    expect(original?.idempotencyKey).toBeUndefined();
    expect(deferrals).toHaveLength(2);
    for (const d of deferrals) {
      expect(d.delaySeconds).toBe(20);
      expect(d.idempotencyKey).toMatch(/^softcrum-deferral:[0-9a-f]{64}$/);
      // The original is acknowledged only after its deferral was stored.
      const ack = h.fake.leaseCalls.find((c) => c.method === "DELETE" && c.order > d.order);
      expect(ack).toBeDefined();
    }
    expect(directives(h).filter((c) => c.method === "DELETE").length).toBe(3);
    expect(directives(h).every((c) => c.method === "DELETE")).toBe(true);
    expect(directives(h)[0]?.order).toBeGreaterThan(deferrals[0]?.order ?? Number.POSITIVE_INFINITY);
  });

  test("consecutive rate-limited deliveries wait longer each time: the deferral carries the count of deferrals so far (#8 item 9)", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (attempts.length <= 4) throw new RateLimitedError("partner 429"); // no Retry-After
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    expect(attempts).toEqual([1, 1, 1, 1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    const deferrals = h.fake.sends.slice(1);
    expect(deferrals.map((d) => wrapperHead(d.body).deferrals)).toEqual([1, 2, 3, 4]);
    // The job's bytes travel unchanged after the header line (no escaping, no base64).
    const original = h.fake.sends[0]?.body.toString("utf8");
    for (const d of deferrals) expect(text(readVercelWrapper(d.body)?.body)).toBe(original);
    const waits = deferrals.map((d) => d.delaySeconds ?? 0);
    for (let i = 1; i < waits.length; i++) expect(waits[i]).toBeGreaterThan(waits[i - 1] as number);
  });

  test("two consumers of one topic rate-limited on the same message each keep their own deferral", async () => {
    const h = await open("push");
    const first = pointsConsumer();
    let limited = 2;
    const second = defineConsumer({
      name: `${first.name}-b`,
      queue: first.queue,
      kind: "points.award.v1",
      schema: pointsSchema,
      async handle(data, ctx) {
        if (limited-- > 0) throw new RateLimitedError("429", { retryAfterMs: 5_000 });
        await ctx.tx
          .insert(effects)
          .values({ jobId: ctx.envelope.job_id, consumer: `${first.name}-b`, amount: data.points });
      },
    });
    let limitedFirst = 1;
    const firstLimited = defineConsumer({
      ...first,
      async handle(data, ctx) {
        if (limitedFirst-- > 0) throw new RateLimitedError("429", { retryAfterMs: 5_000 });
        await first.handle(data, ctx);
      },
    });
    // h.subscribe gives each consumer its own consumer group, as its own route file would.
    h.subscribe(bind(firstLimited));
    h.subscribe(bindConsumer(second, { db: pg.db, logger: silentLogger, random }));
    await h.queue.publish(first.queue, award(2));
    await h.settle();
    expect(await effectRows(first.name)).toHaveLength(1);
    expect(await effectRows(second.name)).toHaveLength(1);
    expect(h.fake.sends.filter((x) => x.deduplicated)).toHaveLength(0);
  });

  test("when the republish fails, the rate-limited original is not acknowledged but delayed on its lease, and its comeback is still attempt 1", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (attempts.length === 1) throw new RateLimitedError("partner 429", { retryAfterMs: 20_000 });
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    h.fake.failSends(1);
    await h.fake.dispatch();
    expect(directives(h).map((c) => [c.method, c.visibilityTimeoutSeconds])).toEqual([["PATCH", 20]]);
    expect(h.fake.sends.map((x) => x.status)).toEqual([201, 500]);
    await h.settle();
    // The wait on the lease is a recorded hold, not an attempt (#19); nothing was lost.
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("a callback for another topic answers 500 and leaves the message unacknowledged", async () => {
    const h = await open("push");
    const consumer = pointsConsumer();
    h.fake.subscribePush("someone_Delse", h.queue.pushHandler(bind(consumer)), { group: "g" });
    h.fake.inject("someone_Delse", JSON.stringify(award()));
    await h.fake.dispatch();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([500]);
    expect(h.fake.leaseCalls).toEqual([]);
    expect(h.fake.pending("someone_Delse", "g")).toBe(1);
    expect(await effectRows(consumer.name)).toHaveLength(0);
  });

  test("a routing-only callback (large message) is received by id, processed and acknowledged", async () => {
    const h = await open("push");
    const consumer = pointsConsumer();
    const topic = toVercelTopic(consumer.queue);
    h.fake.subscribePush(topic, h.queue.pushHandler(bind(consumer)), { group: "big", mode: "by-id" });
    await h.queue.publish(consumer.queue, award());
    await h.fake.dispatch();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([200]);
    expect(h.fake.leaseCalls.map((c) => c.method)).toEqual(["DELETE"]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("publish → retries → dead letter → replay: the replay is delivered (no dedup key) and applied once", async () => {
    const h = await open("push");
    let broken = true;
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (broken) throw new Error("partner down");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle(24 * 3_600_000);
    expect(attempts).toEqual([1, 2, 3, 4, 5]);
    const [letter] = await letters(consumer.name);
    expect(letter).toMatchObject({ errorClass: "exhausted", attempts: 5, status: "pending_review" });
    expect(directives(h).map((c) => c.method)).toEqual(["PATCH", "PATCH", "PATCH", "PATCH", "DELETE"]);

    broken = false;
    const ops = createOps({ db: pg.db, queue: h.queue, routes: [{ queue: consumer.queue, consumer: consumer.name }] });
    const report = await ops.deadLetters.replay([letter?.id as string], { operator: "ana", reason: "partner back" });
    expect(report.counts).toEqual({ replayed: 1 });
    const replay = h.fake.sends.at(-1);
    expect(replay).toMatchObject({ idempotencyKey: undefined, deduplicated: false });
    expect(h.fake.sends.filter((s) => !s.deduplicated)).toHaveLength(2);
    await h.settle();
    expect(attempts.at(-1)).toBe(1);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(await pg.db.select().from(processedJobs).where(eq(processedJobs.consumer, consumer.name))).toHaveLength(1);
    expect((await letters(consumer.name)).map((r) => r.status)).toEqual(["replayed"]);
  });
});

describe("addressed messages", () => {
  test("a message published for one consumer reaches only that consumer of the topic", async () => {
    const h = await open("push");
    const first = pointsConsumer();
    const second = defineConsumer({
      name: `${first.name}-other`,
      queue: first.queue,
      kind: "points.award.v1",
      schema: pointsSchema,
      async handle(data, ctx) {
        await ctx.tx
          .insert(effects)
          .values({ jobId: ctx.envelope.job_id, consumer: `${first.name}-other`, amount: data.points });
      },
    });
    // Two routes on one topic, each its own consumer group (fan-out).
    h.subscribe(bind(first));
    h.subscribe(bindConsumer(second, { db: pg.db, logger: silentLogger, random }));
    await h.queue.publish(first.queue, award(3), { targetConsumer: first.name });
    await h.settle();
    expect(await effectRows(first.name)).toHaveLength(1);
    expect(await effectRows(second.name)).toHaveLength(0);
    await h.queue.publish(first.queue, award(4)); // not addressed: both
    await h.settle();
    expect(await effectRows(first.name)).toHaveLength(2);
    expect(await effectRows(second.name)).toHaveLength(1);
  });
});

describe("poll mode (worker)", () => {
  const waitFor = async (what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 20_000) => {
    const until = Date.now() + timeoutMs;
    while (!(await condition())) {
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  };

  test("N jobs with duplicates through three concurrent workers: exactly one effect each", async () => {
    const h = await open("poll");
    const failedOnce = new Set<string>();
    const consumer = pointsConsumer((ctx) => {
      // Every fourth job fails its first attempt, so retries interleave with duplicates.
      const n = (ctx.envelope.data as { points: number }).points;
      if (n % 4 === 0 && !failedOnce.has(ctx.envelope.job_id)) {
        failedOnce.add(ctx.envelope.job_id);
        throw new Error("flaky partner");
      }
    });
    const jobs = Array.from({ length: 40 }, (_, i) => award(i + 1));
    for (const job of jobs) await h.queue.publish(consumer.queue, job);
    for (const job of jobs.slice(0, 15)) await h.queue.publish(consumer.queue, job); // duplicates
    const workers = [1, 2, 3].map(() =>
      h.queue.startWorker(bind(consumer), { concurrency: 3, idleDelayMs: 5, errorDelayMs: 5 }),
    );
    const topic = toVercelTopic(consumer.queue);
    const group = toVercelTopic(consumer.name);
    await waitFor("every message to be acknowledged", () => {
      // Retries wait on their lease: move the server's clock so they come back.
      h.fake.clock.advance(60_000);
      return h.fake.pending(topic, group) === 0;
    });
    await Promise.all(workers.map((w) => w.stop()));
    const rows = await effectRows(consumer.name);
    expect(rows).toHaveLength(40);
    expect(new Set(rows.map((r) => r.jobId)).size).toBe(40);
    expect(failedOnce.size).toBe(10);
  });

  test("stop() finishes the deliveries in flight, receives no more, and leaves the rest queued for the next worker", async () => {
    const h = await open("poll");
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let entered = 0;
    const consumer = pointsConsumer(async () => {
      entered += 1;
      await gate;
    });
    const topic = toVercelTopic(consumer.queue);
    const group = toVercelTopic(consumer.name);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) ids.push((await h.queue.publish(consumer.queue, award(i + 1))).messageId as string);
    const worker = h.queue.startWorker(bind(consumer), { concurrency: 2, idleDelayMs: 5 });
    await waitFor("two deliveries in flight", () => entered === 2);
    let stopped = false;
    const stopping = worker.stop().then(() => {
      stopped = true;
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(stopped).toBe(false); // waiting for the deliveries in flight
    release();
    await stopping;
    expect(entered).toBe(2);
    expect(await effectRows(consumer.name)).toHaveLength(2);
    expect(h.fake.pending(topic, group)).toBe(4);
    // Nothing was leased and abandoned: the four left were never delivered.
    expect(ids.map((id) => h.fake.deliveryCount(topic, group, id)).sort()).toEqual([0, 0, 0, 0, 1, 1]);

    const next = h.queue.startWorker(bind(consumer), { concurrency: 2, idleDelayMs: 5 });
    await waitFor("the rest to be delivered", () => h.fake.pending(topic, group) === 0);
    await next.stop();
    expect(await effectRows(consumer.name)).toHaveLength(6);
  });

  test("a message whose worker died mid-delivery comes back after the visibility timeout with the next attempt number", async () => {
    const h = await open("poll");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
    });
    const topic = toVercelTopic(consumer.queue);
    const group = toVercelTopic(consumer.name);
    await h.queue.publish(consumer.queue, award());
    // A process that leased the message and died: the lease is never acknowledged.
    const dying = new PollingQueueClient({ ...h.fake.clientOptions() });
    await expect(
      dying.receive(topic, group, () => {
        throw new Error("SIGKILL");
      }),
    ).rejects.toThrow("SIGKILL");
    expect(await h.queue.receiveAvailable(bind(consumer))).toBe(0); // still leased
    h.fake.clock.advance(300_000);
    expect(await h.queue.receiveAvailable(bind(consumer))).toBe(1);
    expect(attempts).toEqual([2]);
    expect(h.fake.pending(topic, group)).toBe(0);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });
});
