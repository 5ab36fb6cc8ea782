import { describe, expect, test } from "vitest";
import { queuePortContract } from "../../../test/queue-port-contract.ts";
import { ack, job, scripted } from "../../../test/scripted-consumer.ts";
import { createManualClock } from "../../clock.ts";
import { DEFAULT_HANDLER_TIMEOUT_MS, deliveryBoundMs } from "../../consumer.ts";
import { InvalidConfigError, InvalidEnvelopeError, QueueClosedError } from "../../errors.ts";
import type { DeliveryResult } from "../../queue-port.ts";
import { createMemoryQueue, type DeliveryEvent } from "./index.ts";

describe("memory queue", () => {
  test("publish validates the envelope: an invalid one throws and never becomes a message", async () => {
    const queue = createMemoryQueue();
    await expect(queue.publish("q", { ...job(), job_id: "nope" })).rejects.toThrow(InvalidEnvelopeError);
    expect(queue.pending()).toBe(0);
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
