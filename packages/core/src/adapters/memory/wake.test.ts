import { describe, expect, test } from "vitest";
import { ack, job, scripted } from "../../../test/scripted-consumer.ts";
import { createManualClock } from "../../clock.ts";
import type { DeliveryResult } from "../../queue-port.ts";
import { createMemoryQueue } from "./index.ts";

describe("memory queue", () => {
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
