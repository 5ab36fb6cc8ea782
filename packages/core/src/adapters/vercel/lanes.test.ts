/**
 * #20 item 2 on Vercel Queues: a marketing consumer's yield is a deferral
 * like a rate limit's — the adapter keeps or republishes the message without
 * spending an attempt, the service drops nothing — and the job runs once,
 * as attempt 1, when its channel's transactional backlog is gone. Through the
 * real SDK against the fake service, push and poll.
 */
import { eq } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { random } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { deadLetters } from "../../db/schema.ts";
import { createEnvelope } from "../../envelope.ts";
import { inProcessLaneBacklog } from "../../lanes/backlog.ts";
import { laneQueue } from "../../lanes/names.ts";
import type { Delivery, DeliveryResult } from "../../queue-port.ts";

const pg = useEffectsDatabase("vercel-lanes");
const open = useVercelHarnesses();

describe.each(["push", "poll"] as const)("a marketing lane on Vercel Queues (%s)", (mode) => {
  test("yields while the transactional backlog holds a job — no attempt spent, nothing dropped — and runs once, as attempt 1, after it settles", async () => {
    const h = await open(mode);
    const backlog = inProcessLaneBacklog({ refreshMs: 0 });
    const name = `vercel-lanes.marketing-${mode}`;
    const attempts: number[] = [];
    const consumer = defineConsumer({
      name,
      queue: laneQueue("email", "marketing"),
      kind: "email.blast.v1",
      schema: z.object({ n: z.number().int() }),
      async handle(data, ctx) {
        attempts.push(ctx.attempt);
        await ctx.tx.insert(effects).values({ jobId: ctx.envelope.job_id, consumer: name, amount: data.n });
      },
    });
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, random, laneBacklog: backlog });
    const outcomes: DeliveryResult["outcome"][] = [];
    h.subscribe({
      ...bound,
      name: bound.name,
      queue: bound.queue,
      holds: bound.holds,
      maxAttempts: bound.maxAttempts,
      deliveryBoundMs: bound.deliveryBoundMs,
      deliver: async (delivery: Delivery) => {
        const result = await bound.deliver(delivery);
        outcomes.push(result.outcome);
        return result;
      },
    });
    const transactionalJob = createEnvelope({ tenantId: "t", kind: "email.send.v1", data: {} }).job_id;
    await backlog.add("email", [{ jobId: transactionalJob, dueAt: Date.now() - 1 }]);
    await h.queue.publish(consumer.queue, createEnvelope({ tenantId: "t", kind: "email.blast.v1", data: { n: 7 } }));

    // Two minutes of a transactional backlog: many yields, no run.
    await h.settle(120_000);
    expect(outcomes.length).toBeGreaterThan(10);
    expect(new Set(outcomes)).toEqual(new Set(["yielded"]));
    expect(attempts).toEqual([]);

    await backlog.remove("email", transactionalJob);
    await h.settle();
    expect(attempts).toEqual([1]);
    expect(outcomes.at(-1)).toBe("success");
    expect(await pg.db.select().from(effects).where(eq(effects.consumer, name))).toHaveLength(1);
    expect(await pg.db.select().from(deadLetters).where(eq(deadLetters.consumer, name))).toEqual([]);
    expect(h.fake.drops).toEqual([]);
  });
});
