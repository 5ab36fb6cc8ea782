import { PollingQueueClient } from "@vercel/queue";
import { describe, expect, test } from "vitest";
import { useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { toVercelTopic } from "./topics.ts";

const pg = useEffectsDatabase("vercel-poll");

const { pointsConsumer, bind, effectRows } = pointsFixture(pg, "vercel");

const open = useVercelHarnesses();

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
