/**
 * #19: a service answer means one thing on every path that republishes.
 * The original message is acknowledged only when its successor is known to
 * be stored (201); a 202 ("accepted for deferred processing": stored later,
 * or never) keeps the original — a hop waits on its lease and hops again, a
 * rescue at the last permitted delivery writes the dead letter now — so a
 * 202 never loses a job. Through the real SDK against the fake service.
 */
import { describe, expect, test } from "vitest";
import { useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { RateLimitedError } from "../../errors.ts";
import type { Delivery } from "../../queue-port.ts";

const pg = useEffectsDatabase("vercel-answers");
const { pointsConsumer, bind, effectRows, letters } = pointsFixture(pg, "answers");

const open = useVercelHarnesses();

describe.each(["push", "poll"] as const)("a 202 on a republishing path (%s)", (mode) => {
  test("a hop answered 202 and never stored: the original is kept and hops again; the job runs once, at its time, as attempt 1", async () => {
    const h = await open(mode);
    const consumer = bind(pointsConsumer());
    const seen: number[] = [];
    h.subscribe({
      ...consumer,
      name: consumer.name,
      queue: consumer.queue,
      maxAttempts: 5,
      deliver: (delivery: Delivery) => {
        seen.push(delivery.deliveryCount);
        return consumer.deliver(delivery);
      },
    });
    await h.queue.schedule(consumer.queue, award(), new Date(h.fake.clock.now() + 10 * 86_400_000));
    h.fake.failNextSends({ status: 202, store: false });
    await h.settle(30 * 86_400_000);
    expect(h.fake.sends.map((s) => s.status)).toEqual([201, 202, 201]);
    expect(seen).toEqual([1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.drops).toEqual([]);
  });

  test("a hop whose every republish is answered 202 and never stored, at its last permitted delivery: the dead letter holds the job, the service drops nothing", async () => {
    const h = await open(mode, {
      maxDeliveries: 7,
      fake: {
        faults: {
          send: ({ idempotencyKey }) =>
            idempotencyKey?.startsWith("softcrum-deferral:") ? { status: 202, store: false } : undefined,
        },
      },
    });
    const consumer = bind(pointsConsumer());
    h.subscribe(consumer);
    const dueAt = new Date(h.fake.clock.now() + 10 * 86_400_000);
    await h.queue.schedule(consumer.queue, award(), dueAt);
    await h.settle(30 * 86_400_000);
    expect(h.fake.drops).toEqual([]);
    expect(await effectRows(consumer.name)).toHaveLength(0);
    const rows = await letters(consumer.name);
    expect(rows.map((r) => r.errorClass)).toEqual(["exhausted"]);
    expect(rows[0]?.lastError).toContain(`scheduled for ${dueAt.toISOString()}`);
  });

  test("a rescue at the last permitted delivery answered 202 and never stored: the dead letter is written now, nothing is lost", async () => {
    const h = await open(mode, { maxDeliveries: 7 });
    const consumer = bind(pointsConsumer());
    let deliveries = 0;
    h.subscribe({
      ...consumer,
      name: consumer.name,
      queue: consumer.queue,
      maxAttempts: 5,
      deadLetterNow: consumer.deadLetterNow?.bind(consumer),
      deliver: (delivery: Delivery) => {
        deliveries += 1;
        // A worker that crashes on this job every time (the delivery throws).
        if (deliveries <= 7) return Promise.reject(new Error("worker crashed"));
        return consumer.deliver(delivery);
      },
    });
    await h.queue.publish(consumer.queue, award());
    for (let round = 0; round < 60 && deliveries < 7; round++) {
      if (mode === "push") await h.fake.dispatch();
      else await h.queue.receiveAvailable(consumer, { maxDeliveries: 7 }).catch(() => {});
      const next = h.fake.nextVisibleAt();
      if (next !== undefined) h.fake.clock.advanceTo(next);
      if (deliveries === 6) h.fake.failNextSends({ status: 202, store: false });
    }
    await h.settle();
    const held = (await letters(consumer.name)).length + (await effectRows(consumer.name)).length;
    expect(held).toBe(1);
  });
});

describe.each([
  ["push", true],
  ["push", false],
  ["poll", true],
  ["poll", false],
] as const)("a rate-limit deferral answered 202 (%s, stored later: %s)", (mode, storedLater) => {
  test("a job that is only ever rate-limited is never counted past attempt 1, never dead-lettered, and its copies do not multiply", async () => {
    // Partner quota exhausted for 10 minutes; every deferral the adapter
    // republishes is answered 202 (stored later, or never stored).
    const h = await open(mode, {
      fake: {
        faults: {
          send: ({ idempotencyKey }) =>
            idempotencyKey?.startsWith("softcrum-deferral:") ? { status: 202, store: storedLater } : undefined,
        },
      },
    });
    const quotaBackAt = h.fake.clock.now() + 600_000;
    const attempts: number[] = [];
    const consumer = bind(
      pointsConsumer((ctx) => {
        attempts.push(ctx.attempt);
        if (h.fake.clock.now() < quotaBackAt) throw new RateLimitedError("partner 429", { retryAfterMs: 20_000 });
      }),
    );
    h.subscribe(consumer);
    await h.queue.publish(consumer.queue, award());
    await h.settle(3 * 3_600_000);
    expect(await letters(consumer.name)).toEqual([]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    // Attempts count handler runs that spent one, nothing else: none did.
    expect(new Set(attempts)).toEqual(new Set([1]));
    // About one run per 20 s of the outage (31 when the copies are stored
    // later, 9 when each waits out its 80 s insurance), not one per copy of
    // copies: a kept original whose copy arrived goes without running.
    expect(attempts.length).toBeGreaterThan(5);
    expect(attempts.length).toBeLessThanOrEqual(35);
    expect(h.fake.drops).toEqual([]);
  });
});
