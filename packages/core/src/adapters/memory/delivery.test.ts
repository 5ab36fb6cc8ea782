import { describe, expect, test } from "vitest";
import { ack, job, scripted } from "../../../test/scripted-consumer.ts";
import { createManualClock } from "../../clock.ts";
import { createEnvelope } from "../../envelope.ts";
import type { DeliveryResult } from "../../queue-port.ts";
import { createMemoryQueue, type DeliveryEvent } from "./index.ts";

describe("memory queue", () => {
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
});

describe("deliveries that do no I/O", () => {
  test("a lane whose deliveries all yield at once, over and over, still lets timers and other work run (real clock)", async () => {
    const queue = createMemoryQueue({ concurrency: 4 });
    const yielded: DeliveryResult = {
      outcome: "yielded",
      ack: false,
      retryAfterMs: 0,
      spendsAttempt: false,
      error: "yielded",
    };
    const { consumer, seen } = scripted("q", () => yielded);
    queue.subscribe(consumer);
    for (let i = 0; i < 20; i++) await queue.publish("q", job());
    // Were each next delivery started inside the last one's settling, this
    // timer would never fire: the chain of yields would hold the event loop.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(seen.length).toBeGreaterThan(20);
    await queue.close();
  });
});
