import { describe, expect, test } from "vitest";
import { effects, silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture, pointsSchema, random } from "../../../test/points-fixture.ts";
import { useVercelHarnesses, type VercelHarness } from "../../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { RateLimitedError } from "../../errors.ts";
import { readVercelWrapper } from "./wrapper.ts";

const pg = useEffectsDatabase("vercel-republish");

const { pointsConsumer, rateLimitedConsumer, bind, effectRows, letters } = pointsFixture(pg, "vercel");

/** Acknowledgements and visibility changes, without the push route's lease confirmation (a PATCH to the full 300 s lease). */
const directives = (h: VercelHarness) =>
  h.fake.leaseCalls.filter((c) => !(c.method === "PATCH" && c.visibilityTimeoutSeconds === 300));
/** The JSON header of a wrapper the adapter sent (a deferral, a replay, a delayed message). */
const wrapperHead = (body: Buffer) => JSON.parse(body.subarray(0, body.indexOf(10)).toString("utf8"));
const text = (body: string | Uint8Array | undefined) =>
  typeof body === "string" ? body : Buffer.from(body ?? new Uint8Array()).toString("utf8");

const open = useVercelHarnesses();

describe("push mode (route handler)", () => {
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

  test("a deferral whose copy was stored but whose acknowledgement failed: the original's comeback goes without running, and the job runs once, from its copy, as attempt 1", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    // Rate limited for 10 minutes: the copy comes due after the original's comeback.
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (attempts.length === 1) throw new RateLimitedError("partner 429", { retryAfterMs: 600_000 });
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    h.fake.failLeaseCalls(1, { method: "DELETE", status: 500 });
    await h.fake.dispatch();
    expect(h.fake.sends.map((x) => [x.status, x.delaySeconds])).toEqual([
      [201, undefined],
      [201, 600],
    ]);
    expect(h.fake.callbacks.map((c) => [c.deliveryCount, c.status])).toEqual([[1, 500]]);
    await h.settle(86_400_000);
    // The original came back (delivery 2) and was acknowledged without running: its job lives in the copy.
    expect(h.fake.callbacks.map((c) => [c.deliveryCount, c.status])).toEqual([
      [1, 500],
      [2, 200],
      [1, 200],
    ]);
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.drops).toEqual([]);
  });
});
