/** #18 item 5: every wait is clamped to the timer limit and re-checked against its due time when it fires. */
import { afterEach, describe, expect, test, vi } from "vitest";
import { createMemoryQueue } from "./adapters/memory/index.ts";
import { createEnvelope } from "./envelope.ts";
import { scheduleFenceCleanup } from "./maintenance/fence-cleanup.ts";
import type { BoundConsumer } from "./queue-port.ts";
import { checkTimerPeriod, MAX_TIMER_DELAY_MS, sleepUntil, timerDelay } from "./timers.ts";

const DAY = 86_400_000;
afterEach(() => {
  vi.restoreAllMocks();
});

describe("the timer limit (#18 item 5)", () => {
  test("timerDelay clamps to what setTimeout honours", () => {
    expect(timerDelay(30 * DAY)).toBe(MAX_TIMER_DELAY_MS);
    expect(timerDelay(-5)).toBe(0);
    expect(timerDelay(Number.NaN)).toBe(0);
    expect(timerDelay(1_500)).toBe(1_500);
  });

  test("sleepUntil a time 30 days ahead keeps waiting (arming one timer), and ends at once on abort", async () => {
    const armed = vi.spyOn(globalThis, "setTimeout");
    const controller = new AbortController();
    let resolved = false;
    const sleeping = sleepUntil(Date.now() + 30 * DAY, Date.now, controller.signal).then(() => {
      resolved = true;
    });
    await new Promise((r) => setTimeout(r, 300));
    expect(resolved).toBe(false);
    // The spy also counts the test's own 300 ms timer.
    expect(armed.mock.calls.filter(([, ms]) => ms === MAX_TIMER_DELAY_MS)).toHaveLength(1);
    controller.abort();
    await sleeping;
    expect(resolved).toBe(true);
  });

  test("sleepUntil whose clamped timer fires early re-checks its due time and waits again", async () => {
    vi.useFakeTimers();
    try {
      let now = 0;
      let resolved = false;
      const sleeping = sleepUntil(MAX_TIMER_DELAY_MS * 2, () => now).then(() => {
        resolved = true;
      });
      // The clamped timer fires; the due time (read from `now`) has not come.
      await vi.advanceTimersByTimeAsync(MAX_TIMER_DELAY_MS);
      expect(resolved).toBe(false);
      now = MAX_TIMER_DELAY_MS * 2;
      await vi.advanceTimersByTimeAsync(MAX_TIMER_DELAY_MS);
      await sleeping;
      expect(resolved).toBe(true);
    } finally {
      vi.useRealTimers();
    }
  });

  test("the in-process queue waiting on a job scheduled 30 days ahead arms one timer, not one every millisecond", async () => {
    const queue = createMemoryQueue();
    let runs = 0;
    const consumer: BoundConsumer = {
      name: "timers.c",
      queue: "timers.q",
      deliver: async () => {
        runs += 1;
        return { outcome: "success", ack: true };
      },
    };
    queue.subscribe(consumer);
    const armed = vi.spyOn(globalThis, "setTimeout");
    await queue.schedule(
      "timers.q",
      createEnvelope({ tenantId: "t", kind: "k.v1", data: {} }),
      new Date(Date.now() + 30 * DAY),
    );
    await new Promise((r) => setTimeout(r, 300));
    await queue.close();
    expect(runs).toBe(0);
    // Before the fix: 400+ timers of ~1 ms in 300 ms, each rescanning every message.
    // Now the timers follow the queue's events, not the time waited: per event
    // (subscribe, schedule, close) at most a throttled scan (≤ 5 ms) and the
    // due-time timer, plus this test's own wait — however slow the machine.
    expect(armed.mock.calls.length).toBeLessThanOrEqual(10);
  });

  test("a period past the timer limit is refused, not run every millisecond", () => {
    expect(() => checkTimerPeriod("pollIntervalMs", 30 * DAY)).toThrow(/pollIntervalMs/);
    const cleanup = { ttlMs: DAY, run: async () => ({}) as never };
    expect(() => scheduleFenceCleanup(cleanup, { intervalMs: 30 * DAY })).toThrow(/intervalMs/);
  });
});
