import { describe, expect, test } from "vitest";
import { TEST_QUEUE_SECRET } from "../../../test/fake-vercel-queues.ts";
import { effects, silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture, pointsSchema, random } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { createVercelQueue } from "./queue.ts";

const pg = useEffectsDatabase("vercel-queue");

const { pointsConsumer, bind, effectRows } = pointsFixture(pg, "vercel");

/** The JSON header of a wrapper the adapter sent (a deferral, a replay, a delayed message). */
const wrapperHead = (body: Buffer) => JSON.parse(body.subarray(0, body.indexOf(10)).toString("utf8"));

const open = useVercelHarnesses();

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
