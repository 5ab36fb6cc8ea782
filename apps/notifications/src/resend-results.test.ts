import { classifyFailure, isSoftcrumError } from "@softcrum/core";
import { describe, expect, test } from "vitest";
import { QUOTA_WAIT_MS, ResendUnavailableError, retryAfterMsOf, sentOrThrow } from "./resend-results.ts";

const failed = (statusCode: number | null, name: string, headers: Record<string, string> | null = {}) => ({
  data: null,
  error: { statusCode, name, message: "m" },
  headers,
});
const thrown = (run: () => unknown): unknown => {
  try {
    run();
  } catch (error) {
    return error;
  }
  throw new Error("expected a throw");
};

describe("sentOrThrow", () => {
  test("returns the data of a success", () => {
    expect(sentOrThrow({ data: { id: "x" }, error: null, headers: {} }, "POST /emails")).toEqual({ id: "x" });
  });

  test("a 429 is a RateLimitedError with the Retry-After, which the harness defers without an attempt", () => {
    const error = thrown(() => sentOrThrow(failed(429, "rate_limit_exceeded", { "retry-after": "2" }), "POST /emails"));
    expect(isSoftcrumError(error, "RATE_LIMITED")).toBe(true);
    expect(classifyFailure(error)).toMatchObject({ failureClass: "rate_limited", retryAfterMs: 2_000 });
  });

  test("a quota 429 without Retry-After waits QUOTA_WAIT_MS", () => {
    const error = thrown(() => sentOrThrow(failed(429, "daily_quota_exceeded", null), "POST /emails"));
    expect(classifyFailure(error)).toMatchObject({ failureClass: "rate_limited", retryAfterMs: QUOTA_WAIT_MS });
  });

  test.each([
    [422, "validation_error"],
    [400, "invalid_idempotency_key"],
    [403, "invalid_api_key"],
    [409, "invalid_idempotent_request"],
  ])("a %i %s is permanent (dead-lettered at once)", (status, name) => {
    const error = thrown(() => sentOrThrow(failed(status, name), "POST /emails/batch"));
    expect(classifyFailure(error).failureClass).toBe("permanent");
    expect(String(error)).toContain(`${status} ${name}`);
  });

  test.each([
    [500, "internal_server_error"],
    [503, "application_error"],
    [null, "application_error"],
    [409, "concurrent_idempotent_requests"],
    [408, "application_error"],
  ])("a %s %s is transient (retried)", (status, name) => {
    const error = thrown(() => sentOrThrow(failed(status, name), "POST /emails"));
    expect(error).toBeInstanceOf(ResendUnavailableError);
    expect(classifyFailure(error).failureClass).toBe("transient");
  });
});

test("retryAfterMsOf reads seconds and HTTP dates, and nothing else", () => {
  const now = Date.parse("2026-12-01T10:00:00Z");
  expect(retryAfterMsOf({ "retry-after": "3" }, now)).toBe(3_000);
  expect(retryAfterMsOf({ "retry-after": "Tue, 01 Dec 2026 10:00:05 GMT" }, now)).toBe(5_000);
  expect(retryAfterMsOf({ "retry-after": "soon" }, now)).toBeUndefined();
  expect(retryAfterMsOf(null, now)).toBeUndefined();
});
