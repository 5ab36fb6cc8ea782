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

describe("a replay delivered once (deliverReplayOnce, #21 item 4)", () => {
  const retry: DeliveryResult = {
    outcome: "deferred",
    ack: false,
    retryAfterMs: 10,
    spendsAttempt: false,
    error: "database said no",
  };
  const never = () => new Promise<DeliveryResult>(() => {});

  test("resolves with its first delivery's result; one not acknowledged is never delivered again", async () => {
    const queue = createMemoryQueue();
    const c = scripted("q", (_, n) => (n === 1 ? retry : ack));
    queue.subscribe(c.consumer);
    const body = JSON.stringify(job());
    const delivered = await queue.deliverReplayOnce("q", body, { targetConsumer: "c", timeoutMs: 5_000 });
    expect(delivered).toEqual({ status: "settled", messageId: expect.any(String), result: retry });
    expect(queue.pending()).toBe(0);
    await queue.drain();
    expect(c.seen.map((d) => [d.body, d.replay, d.targetConsumer])).toEqual([[body, true, "c"]]);
    await queue.close();
  });

  test("an acknowledged first delivery settles it too", async () => {
    const queue = createMemoryQueue();
    queue.subscribe(scripted("q", () => ack).consumer);
    await expect(
      queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 5_000 }),
    ).resolves.toMatchObject({ status: "settled", result: ack });
    expect(queue.pending()).toBe(0);
    await queue.close();
  });

  test("the wait's end: one in flight is abandoned (unsettled), one behind it never starts (not_started); drain and close return", async () => {
    const queue = createMemoryQueue({ replayConcurrency: 1 });
    const c = scripted("q", never);
    queue.subscribe(c.consumer);
    const first = queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 60 });
    const second = queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 30 });
    await expect(second).resolves.toMatchObject({ status: "not_started" });
    await expect(first).resolves.toMatchObject({ status: "unsettled" });
    expect(queue.pending()).toBe(0);
    await expect(queue.drain()).resolves.toBeUndefined();
    await expect(queue.close()).resolves.toBeUndefined();
    expect(c.seen).toHaveLength(1);
  });

  test("close() ends the waits at once after its own bound, and refuses new ones", async () => {
    const queue = createMemoryQueue({ closeTimeoutMs: 20 });
    queue.subscribe(scripted("q", never).consumer);
    const waiting = queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 60_000 });
    await new Promise((r) => setTimeout(r, 5));
    await queue.close();
    await expect(waiting).resolves.toMatchObject({ status: "unsettled" });
    await expect(
      queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 10 }),
    ).rejects.toThrow(QueueClosedError);
  });

  test("past the visibility timeout (manual clock) it is abandoned and dropped, not delivered again", async () => {
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 1_000, stuckAfterMs: 10 });
    const c = scripted("q", never);
    queue.subscribe(c.consumer);
    const waiting = queue.deliverReplayOnce("q", JSON.stringify(job()), { targetConsumer: "c", timeoutMs: 60_000 });
    await queue.drain();
    await expect(waiting).resolves.toMatchObject({ status: "unsettled" });
    expect(queue.pending()).toBe(0);
    expect(c.seen).toHaveLength(1);
    await queue.close();
  });

  test("refused for a consumer not subscribed here, and for a bad timeout", async () => {
    const queue = createMemoryQueue();
    await expect(queue.deliverReplayOnce("q", "{}", { targetConsumer: "c", timeoutMs: 10 })).rejects.toThrow(
      /nothing would deliver the replay/,
    );
    queue.subscribe(scripted("q", () => ack).consumer);
    await expect(queue.deliverReplayOnce("q", "{}", { targetConsumer: "c", timeoutMs: 0 })).rejects.toThrow(
      InvalidConfigError,
    );
    expect(queue.pending()).toBe(0);
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
