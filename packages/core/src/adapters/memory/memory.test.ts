import { describe, expect, test } from "vitest";
import { queuePortContract } from "../../../test/queue-port-contract.ts";
import { createManualClock } from "../../clock.ts";
import { DEFAULT_HANDLER_TIMEOUT_MS, deliveryBoundMs } from "../../consumer.ts";
import { createEnvelope } from "../../envelope.ts";
import { InvalidConfigError, InvalidEnvelopeError, QueueClosedError } from "../../errors.ts";
import type { BoundConsumer, Delivery, DeliveryResult } from "../../queue-port.ts";
import { createMemoryQueue, type DeliveryEvent } from "./index.ts";

/** A consumer that answers each delivery from a script, to drive the transport on its own. */
function scripted(
  queue: string,
  answer: (d: Delivery, n: number) => DeliveryResult | Promise<DeliveryResult>,
  name = "c",
) {
  const seen: Delivery[] = [];
  const consumer: BoundConsumer = {
    name,
    queue,
    async deliver(delivery) {
      seen.push(delivery);
      return answer(delivery, seen.length);
    },
  };
  return { consumer, seen };
}

const ack: DeliveryResult = { outcome: "success", ack: true };
const job = () => createEnvelope({ tenantId: "t", kind: "k.v1", data: { n: 1 } });

describe("memory queue", () => {
  test("publish validates the envelope: an invalid one throws and never becomes a message", async () => {
    const queue = createMemoryQueue();
    await expect(queue.publish("q", { ...job(), job_id: "nope" })).rejects.toThrow(InvalidEnvelopeError);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("delivers the envelope as JSON text with delivery count 1, and removes it on ack", async () => {
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const { consumer, seen } = scripted("q", () => ack);
    queue.subscribe(consumer);
    const envelope = job();
    const receipt = await queue.publish("q", envelope);
    await queue.drain();
    expect(seen).toEqual([
      { body: JSON.stringify(envelope), deliveryCount: 1, messageId: receipt.messageId, dueAt: clock.now() },
    ]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("redelivers after the delay the harness asks for, counting deliveries", async () => {
    const clock = createManualClock(1_000_000);
    const queue = createMemoryQueue({ clock });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    const { consumer } = scripted("q", (_d, n) =>
      n < 3 ? { outcome: "retry", ack: false, retryAfterMs: n * 1000, spendsAttempt: true, error: "e" } : ack,
    );
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(events.map((e) => [e.deliveryCount, e.at])).toEqual([
      [1, 1_000_000],
      [2, 1_001_000],
      [3, 1_003_000],
    ]);
    await queue.close();
  });

  test("a deferral that does not spend an attempt keeps the delivery count", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    const { consumer, seen } = scripted("q", (_d, n) =>
      n < 4 ? { outcome: "rate_limited", ack: false, retryAfterMs: 500, spendsAttempt: false, error: "429" } : ack,
    );
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(seen.map((d) => d.deliveryCount)).toEqual([1, 1, 1, 1]);
    await queue.close();
  });

  test("a delivery that throws, or is not acknowledged, comes back after the visibility timeout", async () => {
    const clock = createManualClock(0);
    const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 45_000 });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    const { consumer } = scripted("q", (_d, n) => {
      if (n === 1) throw new Error("worker crashed");
      if (n === 2) return { outcome: "dead_letter_failed", ack: false, error: "db down" };
      return ack;
    });
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(events.map((e) => [e.result.outcome, e.deliveryCount, e.at])).toEqual([
      ["thrown", 1, 0],
      ["dead_letter_failed", 2, 45_000],
      ["success", 3, 90_000],
    ]);
    await queue.close();
  });

  test("runs up to `concurrency` deliveries at once per consumer", async () => {
    const queue = createMemoryQueue({ concurrency: 3 });
    let running = 0;
    let peak = 0;
    const { consumer } = scripted("q", async () => {
      running += 1;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 20));
      running -= 1;
      return ack;
    });
    queue.subscribe(consumer);
    await Promise.all(Array.from({ length: 10 }, () => queue.publish("q", job())));
    await queue.drain();
    expect(peak).toBe(3);
    await queue.close();
  });

  test("schedule holds the message until runAt; a runAt in the past publishes now", async () => {
    const clock = createManualClock(5_000);
    const queue = createMemoryQueue({ clock });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    queue.subscribe(scripted("q", () => ack).consumer);
    await queue.schedule("q", job(), new Date(65_000));
    await queue.schedule("q", job(), new Date(1_000));
    await queue.drain();
    expect(events.map((e) => e.at)).toEqual([5_000, 65_000]);
    await expect(queue.schedule("q", job(), new Date(Number.NaN))).rejects.toThrow(/runAt must be a valid Date/);
    await queue.close();
  });

  test("an idempotency key suppresses a second publish inside the window, not after it", async () => {
    const clock = createManualClock(0);
    const queue = createMemoryQueue({ clock, dedupWindowMs: 10_000 });
    const { consumer, seen } = scripted("q", () => ack);
    queue.subscribe(consumer);
    const first = await queue.publish("q", job(), { idempotencyKey: "k" });
    const second = await queue.publish("q", job(), { idempotencyKey: "k" });
    expect(second.messageId).toBe(first.messageId);
    clock.advance(10_001);
    await queue.publish("q", job(), { idempotencyKey: "k" });
    await queue.drain();
    expect(seen).toHaveLength(2);
    await queue.close();
  });

  test("a publish refused for an unsubscribed targetConsumer records no idempotency key: its corrected retry is delivered (#9 item 2)", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    const a = scripted("q", () => ack, "a");
    queue.subscribe(a.consumer);
    const envelope = job();
    await expect(queue.publish("q", envelope, { idempotencyKey: "k", targetConsumer: "typo" })).rejects.toThrow(
      InvalidConfigError,
    );
    expect(queue.pending()).toBe(0);
    const corrected = await queue.publish("q", envelope, { idempotencyKey: "k", targetConsumer: "a" });
    await queue.drain();
    expect(a.seen.map((d) => [d.messageId, d.body])).toEqual([[corrected.messageId, JSON.stringify(envelope)]]);
    // Once accepted, the key suppresses a repeat as before.
    const again = await queue.publish("q", envelope, { idempotencyKey: "k", targetConsumer: "a" });
    expect(again.messageId).toBe(corrected.messageId);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("each consumer of a queue gets its own copy; messages published before subscribing wait for the first one", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    await queue.publish("q", job());
    const a = scripted("q", () => ack, "a");
    const b = scripted("q", () => ack, "b");
    queue.subscribe(a.consumer);
    queue.subscribe(b.consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(a.seen).toHaveLength(2);
    expect(b.seen).toHaveLength(1);
    expect(() => queue.subscribe(a.consumer)).toThrow(/already subscribed/);
    await queue.close();
  });

  test("an observer that throws neither breaks the delivery nor starves later observers", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    const seen: string[] = [];
    queue.onDelivery(() => {
      throw new Error("observer bug");
    });
    queue.onDelivery((e) => seen.push(e.result.outcome));
    queue.subscribe(scripted("q", () => ack).consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(seen).toEqual(["success"]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("close waits for deliveries in flight and refuses new publishes", async () => {
    const queue = createMemoryQueue();
    let finished = false;
    queue.subscribe(
      scripted("q", async () => {
        await new Promise((r) => setTimeout(r, 30));
        finished = true;
        return ack;
      }).consumer,
    );
    await queue.publish("q", job());
    await new Promise((r) => setTimeout(r, 5));
    await queue.close();
    expect(finished).toBe(true);
    await expect(queue.publish("q", job())).rejects.toThrow(QueueClosedError);
  });

  test("a delivery that never settles is treated like a crash at its visibility timeout: drain() returns and the message is delivered again (#8 item 12)", async () => {
    const clock = createManualClock(0);
    const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 45_000, stuckAfterMs: 20 });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    const { consumer, seen } = scripted("q", (_d, n) => (n === 1 ? new Promise<DeliveryResult>(() => {}) : ack));
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(seen.map((d) => d.deliveryCount)).toEqual([1, 2]);
    expect(events.map((e) => [e.result.outcome, e.deliveryCount, e.at])).toEqual([
      ["thrown", 1, 0],
      ["success", 2, 45_000],
    ]);
    expect(events[0]?.result).toMatchObject({ error: expect.stringMatching(/did not settle within the visibility/) });
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("with the system clock too, a delivery that never settles comes back after the visibility timeout, and drain() returns (#8 item 12)", async () => {
    const queue = createMemoryQueue({ visibilityTimeoutMs: 40, concurrency: 1 });
    const { consumer, seen } = scripted("q", (_d, n) => (n === 1 ? new Promise<DeliveryResult>(() => {}) : ack));
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.publish("q", job());
    await queue.drain();
    // The stuck delivery's slot was freed: the other message went through too.
    expect(seen.map((d) => d.deliveryCount).sort()).toEqual([1, 1, 2]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("drain() returns when the queue is closed while messages still wait for a slot", async () => {
    const queue = createMemoryQueue({ concurrency: 1 });
    let release!: () => void;
    const running = new Promise<DeliveryResult>((resolve) => {
      release = () => resolve(ack);
    });
    const { consumer, seen } = scripted("q", () => running);
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.publish("q", job());
    const drained = queue.drain();
    const closed = queue.close();
    release();
    await closed;
    await drained;
    // The second message was never delivered: it stays, as on a real transport.
    expect(seen).toHaveLength(1);
    expect(queue.pending()).toBe(1);
  }, 10_000);

  test("a replay yielding to live messages while every live slot is held by a stuck delivery does not hold drain() (manual clock)", async () => {
    const clock = createManualClock(0);
    const queue = createMemoryQueue({ clock, concurrency: 1, visibilityTimeoutMs: 45_000, stuckAfterMs: 20 });
    const { consumer, seen } = scripted("q", (_d, n) => (n === 1 ? new Promise<DeliveryResult>(() => {}) : ack));
    queue.subscribe(consumer);
    await queue.publish("q", job());
    await queue.publish("q", job());
    await queue.publishReplay("q", JSON.stringify(job()), { targetConsumer: "c" });
    await queue.drain();
    // The stuck delivery was abandoned at its visibility timeout; then everything ran.
    expect(seen.map((d) => [d.deliveryCount, d.replay === true]).sort()).toEqual([
      [1, false],
      [1, false],
      [1, true],
      [2, false],
    ]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  }, 10_000);

  // Clocks that move on at every reading, as a loaded machine's do between
  // two reads: what was not due when the pump read the clock is due by the
  // time the queue asks when to wake up next, and must still be woken.
  const tickingClockCases = [
    {
      what: "a lease that expires between the pump's reading of the clock and the next one is still reaped",
      step: 30,
      options: { visibilityTimeoutMs: 40 },
      answer: (n: number) => (n === 1 ? new Promise<DeliveryResult>(() => {}) : ack),
    },
    {
      // Seen as a 60 s hang of a 5 ms retry in the loyalty example's tests.
      what: "a retry that comes due between the pump's reading of the clock and the next one is still delivered",
      step: 15,
      options: {},
      answer: (n: number): DeliveryResult =>
        n === 1 ? { outcome: "retry", ack: false, retryAfterMs: 20, spendsAttempt: true, error: "e" } : ack,
    },
  ];
  for (const { what, step, options, answer } of tickingClockCases) {
    test(`${what}: drain() returns`, async () => {
      let t = 1_000_000;
      const queue = createMemoryQueue({ clock: { now: () => (t += step) }, concurrency: 1, ...options });
      const { consumer, seen } = scripted("q", (_d, n) => answer(n));
      queue.subscribe(consumer);
      await queue.publish("q", job());
      await queue.drain();
      expect(seen.map((d) => d.deliveryCount)).toEqual([1, 2]);
      expect(queue.pending()).toBe(0);
      await queue.close();
    }, 10_000);
  }

  test("however far the clock moves between two readings, a retry is delivered and drain() returns", async () => {
    // Every pairing of clock step and retry delay: some retry comes due
    // exactly between the pump's reading and the next one, where no timer
    // would start it.
    const runs: Promise<number[]>[] = [];
    for (let step = 1; step <= 40; step += 3) {
      for (let retryAfterMs = 1; retryAfterMs <= 60; retryAfterMs += 4) {
        let t = 1_000_000;
        const queue = createMemoryQueue({ clock: { now: () => (t += step) }, concurrency: 1 });
        const { consumer, seen } = scripted("q", (_d, n) =>
          n === 1 ? { outcome: "retry", ack: false, retryAfterMs, spendsAttempt: true, error: "e" } : ack,
        );
        queue.subscribe(consumer);
        runs.push(
          (async () => {
            await queue.publish("q", job());
            await queue.drain();
            await queue.close();
            return seen.map((d) => d.deliveryCount);
          })(),
        );
      }
    }
    const counts = await Promise.all(runs);
    expect(counts).toEqual(counts.map(() => [1, 2]));
  }, 20_000);

  test("close() returns after closeTimeoutMs while a delivery never settles (#8 item 12)", async () => {
    const queue = createMemoryQueue({ clock: createManualClock(), closeTimeoutMs: 30 });
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    queue.subscribe(
      scripted("q", () => {
        started();
        return new Promise<DeliveryResult>(() => {});
      }).consumer,
    );
    await queue.publish("q", job());
    await running;
    await queue.close();
    expect(queue.pending()).toBe(1); // not acknowledged: a real transport would deliver it again
    await expect(queue.publish("q", job())).rejects.toThrow(QueueClosedError);
  });

  test("a late result of an abandoned delivery changes nothing: no second removal, no lost or reset message (#8 item 12)", async () => {
    const clock = createManualClock(0);
    const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 10_000 });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    const held: ((r: DeliveryResult) => void)[] = [];
    const { consumer, seen } = scripted("q", (d) =>
      JSON.parse(String(d.body)).data.n === 1 ? new Promise<DeliveryResult>((resolve) => held.push(resolve)) : ack,
    );
    queue.subscribe(consumer);
    await queue.publish("q", createEnvelope({ tenantId: "t", kind: "k.v1", data: { n: 1 } }));
    // Another message, due later: a wrong removal would take it.
    await queue.publish("q", createEnvelope({ tenantId: "t", kind: "k.v1", data: { n: 2 } }), { delayMs: 60_000 });
    expect(held).toHaveLength(1);
    clock.advance(10_000); // delivery 1 is abandoned, delivery 2 starts
    clock.advance(10_000); // delivery 2 is abandoned, delivery 3 starts
    expect(held).toHaveLength(3);
    // Delivery 1 answers late with a retry: delivery 3 still holds the message.
    held[0]?.({ outcome: "retry", ack: false, retryAfterMs: 1, spendsAttempt: true, error: "late" });
    await new Promise((r) => setImmediate(r));
    clock.advance(5);
    expect(held).toHaveLength(3);
    held[2]?.(ack);
    await new Promise((r) => setImmediate(r));
    expect(queue.pending()).toBe(1);
    // Delivery 2 acknowledges late, after the message is gone: nothing else may be removed.
    held[1]?.(ack);
    await new Promise((r) => setImmediate(r));
    expect(queue.pending()).toBe(1);
    await queue.drain();
    expect(events.map((e) => [e.result.outcome, e.deliveryCount])).toEqual([
      ["thrown", 1],
      ["thrown", 2],
      ["success", 3],
      ["success", 1],
    ]);
    expect(seen.map((d) => JSON.parse(String(d.body)).data.n)).toEqual([1, 1, 1, 2]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("subscribe() refuses a consumer whose handler time bound is not below the visibility timeout (#8 item 12)", async () => {
    const queue = createMemoryQueue({ visibilityTimeoutMs: 30_000 });
    const { consumer } = scripted("q", () => ack);
    expect(() => queue.subscribe({ ...consumer, deliver: consumer.deliver, timeoutMs: 30_000 })).toThrow(
      InvalidConfigError,
    );
    expect(() => queue.subscribe({ ...consumer, deliver: consumer.deliver, timeoutMs: 45_000 })).toThrow(
      /timeoutMs 45000\) must be below this queue's visibility timeout \(30000 ms\)/,
    );
    queue.subscribe({ ...consumer, deliver: consumer.deliver, timeoutMs: 29_999 });
    await queue.close();
  });

  test("subscribe() checks a consumer's whole delivery, not only its handler bound: deliveryBoundMs must be below the visibility timeout (#18 item 7)", async () => {
    const queue = createMemoryQueue({ visibilityTimeoutMs: 40_000 });
    const { consumer } = scripted("q", () => ack);
    // timeoutMs alone would pass; the whole delivery (2 × 20 s + 5 s) does not.
    expect(() =>
      queue.subscribe({ ...consumer, deliver: consumer.deliver, timeoutMs: 20_000, deliveryBoundMs: 45_000 }),
    ).toThrow(
      /deliveryBoundMs 45000: the work transaction's timeoutMs 20000, .*must be below this queue's visibility timeout \(40000 ms\)/,
    );
    queue.subscribe({ ...consumer, deliver: consumer.deliver, timeoutMs: 15_000, deliveryBoundMs: 35_000 });
    await queue.close();
  });

  test("the default queue takes a consumer with the default timeoutMs: 2 × 25 s + 5 s is below its 60 s visibility timeout", async () => {
    const queue = createMemoryQueue();
    const { consumer } = scripted("q", () => ack);
    const defaults = deliveryBoundMs({ timeoutMs: DEFAULT_HANDLER_TIMEOUT_MS });
    expect(defaults).toBe(55_000);
    queue.subscribe({
      ...consumer,
      deliver: consumer.deliver,
      timeoutMs: DEFAULT_HANDLER_TIMEOUT_MS,
      deliveryBoundMs: defaults,
    });
    await queue.close();
  });

  test("with the system clock, a retry comes back after a real delay", async () => {
    const queue = createMemoryQueue();
    const { consumer, seen } = scripted("q", (_d, n) =>
      n === 1 ? { outcome: "retry", ack: false, retryAfterMs: 30, spendsAttempt: true, error: "e" } : ack,
    );
    queue.subscribe(consumer);
    const started = Date.now();
    await queue.publish("q", job());
    await queue.drain();
    expect(seen.map((d) => d.deliveryCount)).toEqual([1, 2]);
    expect(Date.now() - started).toBeGreaterThanOrEqual(25);
    await queue.close();
  });
});

queuePortContract("in-process memory queue", async () => {
  const clock = createManualClock(1_700_000_000_000);
  const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 30_000 });
  return {
    port: queue,
    subscribe: (consumer) => queue.subscribe(consumer),
    settle: () => queue.drain(),
    now: () => clock.now(),
    close: () => queue.close(),
  };
});
