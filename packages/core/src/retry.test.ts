import { describe, expect, test } from "vitest";
import { InvalidConfigError } from "./errors.ts";
import {
  DEFAULT_RETRY_POLICY,
  DEFERRAL_FLOOR_MS,
  deferralDelayMs,
  maxRetryWindowMs,
  RATE_LIMIT_BACKOFF,
  resolveRetryPolicy,
  retryDelayMs,
} from "./retry.ts";

describe("retry policy", () => {
  test("the default is 5 attempts, base 30 s, cap 1 h", () => {
    expect(DEFAULT_RETRY_POLICY).toEqual({ maxAttempts: 5, baseDelayMs: 30_000, maxDelayMs: 3_600_000 });
  });

  test("delays use equal jitter: retry n waits in [e/2, e) with e = min(cap, base·2^(n-1))", () => {
    const p = DEFAULT_RETRY_POLICY;
    expect([1, 2, 3, 4].map((n) => retryDelayMs(p, n, () => 0))).toEqual([15_000, 30_000, 60_000, 120_000]);
    expect([1, 2, 3, 4].map((n) => retryDelayMs(p, n, () => 0.999_999))).toEqual([29_999, 59_999, 119_999, 239_999]);
    expect(retryDelayMs(p, 20, () => 0.5)).toBe(2_700_000); // capped at 1 h
  });

  test("intervals grow from one retry to the next whatever the jitter draws", () => {
    const worst = [0.999_999, 0, 0.999_999, 0]; // longest then shortest, alternately
    for (const draws of [worst, [0, 0, 0, 0], [0.999_999, 0.999_999, 0.999_999, 0.999_999]]) {
      const delays = draws.map((r, i) => retryDelayMs(DEFAULT_RETRY_POLICY, i + 1, () => r));
      for (let i = 1; i < delays.length; i++) expect(delays[i]).toBeGreaterThan(delays[i - 1] as number);
    }
  });

  test("overrides are merged with the defaults", () => {
    expect(resolveRetryPolicy({ maxAttempts: 3 }, "c")).toEqual({
      maxAttempts: 3,
      baseDelayMs: 30_000,
      maxDelayMs: 3_600_000,
    });
  });

  test.each([
    [{ maxAttempts: 0 }, /maxAttempts must be an integer/],
    [{ maxAttempts: 2.5 }, /maxAttempts must be an integer/],
    [{ baseDelayMs: -1 }, /baseDelayMs must be a positive number/],
    [{ maxDelayMs: 10 }, /maxDelayMs must be a number >= baseDelayMs/],
    [{ maxAttempts: 10 }, /would stop growing its intervals/],
  ])("refuses %j with a clear error", (overrides, message) => {
    expect(() => resolveRetryPolicy(overrides, 'consumer "c"')).toThrow(InvalidConfigError);
    expect(() => resolveRetryPolicy(overrides, 'consumer "c"')).toThrow(message);
  });

  test("the longest retry window of the default policy is 7.5 minutes", () => {
    expect(maxRetryWindowMs(DEFAULT_RETRY_POLICY)).toBe((30 + 60 + 120 + 240) * 1000);
  });
});

describe("deferral backoff (#8 item 9)", () => {
  const backoff = { baseMs: 10_000, capMs: 80_000 };

  test("waits grow with the number of earlier deferrals, with equal jitter, up to the cap (#8 item 9)", () => {
    expect([0, 1, 2, 3, 4, 9].map((n) => deferralDelayMs(n, backoff, () => 0))).toEqual([
      5_000, 10_000, 20_000, 40_000, 40_000, 40_000,
    ]);
    expect([0, 1, 2, 3, 4].map((n) => deferralDelayMs(n, backoff, () => 0.999_999))).toEqual([
      9_999, 19_999, 39_999, 79_999, 79_999,
    ]);
    // Whatever the jitter draws, each wait below the cap is longer than the one before.
    const worst = [0.999_999, 0, 0.999_999, 0];
    const delays = worst.map((r, n) => deferralDelayMs(n, backoff, () => r));
    for (let i = 1; i < delays.length; i++) expect(delays[i]).toBeGreaterThan(delays[i - 1] as number);
    // A huge or nonsensical count neither overflows nor escapes the cap.
    expect(deferralDelayMs(5_000, backoff, () => 0.5)).toBe(60_000);
    expect(deferralDelayMs(Number.NaN, backoff, () => 0)).toBe(5_000);
  });

  test("a provider's Retry-After is honoured, but never below the floor, so 0 cannot hot-loop (#8 item 9)", () => {
    expect(deferralDelayMs(3, { ...backoff, retryAfterMs: 7_000 })).toBe(7_000);
    expect(deferralDelayMs(0, { ...backoff, retryAfterMs: 0 })).toBe(DEFERRAL_FLOOR_MS);
    expect(deferralDelayMs(0, { ...backoff, retryAfterMs: -5_000 })).toBe(1_000);
    expect(deferralDelayMs(0, { ...backoff, retryAfterMs: 0, floorMs: 2_500 })).toBe(2_500);
    expect(deferralDelayMs(0, { baseMs: 10, capMs: 20 }, () => 0)).toBe(1_000);
  });

  test("the rate-limit backoff starts at 15–30 s and is capped at 15 min with a 1 s floor", () => {
    expect(RATE_LIMIT_BACKOFF).toEqual({ baseMs: 30_000, capMs: 900_000, floorMs: 1_000 });
    expect(deferralDelayMs(0, RATE_LIMIT_BACKOFF, () => 0)).toBe(15_000);
    expect(deferralDelayMs(20, RATE_LIMIT_BACKOFF, () => 0.999_999)).toBe(899_999);
  });

  test("refuses a backoff whose cap is below its base", () => {
    expect(() => deferralDelayMs(0, { baseMs: 10, capMs: 5 })).toThrow(InvalidConfigError);
  });
});
