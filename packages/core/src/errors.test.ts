import { describe, expect, test } from "vitest";
import { classifyFailure, describeError, isSoftcrumError, PermanentError, RateLimitedError } from "./errors.ts";

describe("classifyFailure", () => {
  test("PermanentError is permanent", () => {
    expect(classifyFailure(new PermanentError("closed account"))).toEqual({
      failureClass: "permanent",
      message: "PermanentError: closed account",
    });
  });

  test("RateLimitedError is rate limited, with its retry-after", () => {
    expect(classifyFailure(new RateLimitedError("slow down", { retryAfterMs: 1500 }))).toMatchObject({
      failureClass: "rate_limited",
      retryAfterMs: 1500,
    });
  });

  test.each([
    [{ status: 429, retryAfter: 12 }, 12_000],
    [{ statusCode: 429, retryAfter: "3" }, 3_000],
    [{ status: 429, retryAfterMs: 250 }, 250],
    [{ status: 429 }, undefined],
  ])("an HTTP 429 error (%j) is rate limited", (fields, retryAfterMs) => {
    const error = Object.assign(new Error("Too Many Requests"), fields);
    expect(classifyFailure(error)).toEqual({
      failureClass: "rate_limited",
      message: "Error: Too Many Requests",
      retryAfterMs,
    });
  });

  test("Retry-After as an HTTP date is honoured; unusable values fall back to the policy", () => {
    const inTenSeconds = new Date(Date.now() + 10_000).toUTCString();
    const fromDate = classifyFailure(Object.assign(new Error("slow down"), { status: 429, retryAfter: inTenSeconds }));
    expect(fromDate.retryAfterMs).toBeGreaterThan(8_000);
    expect(fromDate.retryAfterMs).toBeLessThanOrEqual(10_000);
    for (const retryAfterMs of [Number.NaN, -5, Number.POSITIVE_INFINITY]) {
      expect(classifyFailure(new RateLimitedError("x", { retryAfterMs })).retryAfterMs).toBeUndefined();
    }
    expect(
      classifyFailure(Object.assign(new Error("x"), { status: 429, retryAfter: "soon" })).retryAfterMs,
    ).toBeUndefined();
    expect(classifyFailure(Object.assign(new Error("x"), { status: 429, retryAfter: 10 ** 9 })).retryAfterMs).toBe(
      86_400_000,
    );
  });

  test.each([
    new Error("ECONNRESET"),
    Object.assign(new Error("server error"), { status: 500 }),
    "a string",
    { weird: true },
  ])("anything else (%s) is transient", (thrown) => {
    expect(classifyFailure(thrown).failureClass).toBe("transient");
  });

  test("errors from another copy of the package are still recognised by their code", () => {
    const foreign = Object.assign(new Error("from another copy"), { "@softcrum/core:error": true, code: "PERMANENT" });
    expect(isSoftcrumError(foreign, "PERMANENT")).toBe(true);
    expect(classifyFailure(foreign).failureClass).toBe("permanent");
    expect(isSoftcrumError(new Error("plain"))).toBe(false);
  });
});

describe("describeError", () => {
  test("never prints the parameters of a wrapped database query (they may hold personal data)", () => {
    const cause = Object.assign(new Error('duplicate key value violates unique constraint "x"'), {
      name: "PostgresError",
    });
    const wrapped = Object.assign(new Error("Failed query: insert into t values ($1)\nparams: jane@example.com"), {
      query: "insert into t values ($1)",
      params: ["jane@example.com"],
      cause,
    });
    const text = describeError(wrapped);
    expect(text).toBe(
      'PostgresError: duplicate key value violates unique constraint "x" [query: insert into t values ($1)]',
    );
    expect(text).not.toContain("jane");
  });

  test("describes non-errors without [object Object]", () => {
    expect(describeError({ a: 1 })).toBe('non-error thrown: {"a":1}');
    expect(describeError("boom")).toBe("boom");
  });
});
