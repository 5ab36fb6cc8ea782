import { describe, expect, test } from "vitest";
import { InvalidConfigError } from "./errors.ts";
import { DEFAULT_RETRY_POLICY, maxRetryWindowMs, resolveRetryPolicy, retryDelayMs } from "./retry.ts";

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
