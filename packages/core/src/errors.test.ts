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

describe("errors are read through what they wrap (#9 item 7)", () => {
  test("AWS SDK v3 throttling is rate limited by its name, $metadata or $retryable, whatever its HTTP status (#9 item 7)", () => {
    const aws = (name: string, fields: object) => Object.assign(new Error("Rate exceeded"), { name }, fields);
    for (const thrown of [
      aws("ThrottlingException", { $fault: "client", $metadata: { httpStatusCode: 400 } }),
      aws("TooManyRequestsException", { $fault: "client", $metadata: { httpStatusCode: 400 } }),
      aws("ServiceException", { $metadata: { httpStatusCode: 429 } }),
      aws("ProvisionedThroughputExceededException", { $retryable: { throttling: true }, $metadata: {} }),
    ]) {
      expect(classifyFailure(thrown).failureClass).toBe("rate_limited");
    }
  });

  test("the shallowest error that decides wins: a handler's PermanentError over the 429 it wraps, a 429 over a PermanentError it wraps (#9 item 7)", () => {
    const http429 = Object.assign(new Error("Too Many Requests"), { status: 429 });
    expect(classifyFailure(new PermanentError("refused", { cause: http429 })).failureClass).toBe("permanent");
    expect(
      classifyFailure(Object.assign(new Error("throttled"), { status: 429, cause: new PermanentError("x") }))
        .failureClass,
    ).toBe("rate_limited");
    // Same depth: waiting never discards work.
    expect(classifyFailure(new AggregateError([new PermanentError("a"), http429])).failureClass).toBe("rate_limited");
  });

  test("a 429 deeper than the bound is not read, and a deep chain is described to the bound (#9 item 7)", () => {
    let error: Error = Object.assign(new Error("Too Many Requests"), { status: 429 });
    for (let i = 0; i < 20; i++) error = new Error(`level ${i}`, { cause: error });
    expect(classifyFailure(error).failureClass).toBe("transient");
    expect(describeError(error).split(" ← caused by ")).toHaveLength(9);
  });

  test("a cause whose message the wrapper quotes is named, not repeated; a system error's code is kept (#9 item 7)", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 10.0.0.7:5432"), { code: "ECONNREFUSED" });
    expect(describeError(new Error(`sync failed: ${refused.message}`, { cause: refused }))).toBe(
      "Error: sync failed: connect ECONNREFUSED 10.0.0.7:5432 ← caused by Error (code ECONNREFUSED)",
    );
  });

  test("a wrapped query error inside a chain still hides its parameters, and its query goes last (#9 item 7)", () => {
    const pgError = Object.assign(new Error('duplicate key value violates unique constraint "x"'), {
      name: "PostgresError",
      code: "23505",
    });
    const wrapped = Object.assign(new Error("Failed query: insert into t values ($1)\nparams: jane@example.com"), {
      query: "insert into t values ($1)",
      params: ["jane@example.com"],
      cause: pgError,
    });
    const text = describeError(new AggregateError([wrapped, new Error("b")], "both failed"));
    expect(text).toBe(
      'AggregateError: both failed [2 errors: (1) PostgresError: duplicate key value violates unique constraint "x"; (2) Error: b] [query: insert into t values ($1)]',
    );
    expect(text).not.toContain("jane");
  });

  test("an error met twice without a cycle is shown once; an empty message adds no colon (#9 item 7)", () => {
    const refused = new Error("connect ECONNREFUSED 10.0.0.7:443");
    const aggregate = new AggregateError([refused, refused], "", { cause: refused });
    expect(describeError(aggregate)).toBe(
      "AggregateError [2 errors: (1) Error: connect ECONNREFUSED 10.0.0.7:443; (2) (shown above)] ← caused by (shown above)",
    );
  });

  test("only an AggregateError's members are read as errors, not another error's `errors` field (#9 item 7)", () => {
    class AllMirrorsFailed extends AggregateError {}
    const mirrors = new AllMirrorsFailed([new Error("a down")], "all mirrors failed");
    expect(describeError(mirrors)).toBe("AggregateError: all mirrors failed [1 error: (1) Error: a down]");
    const validation = Object.assign(new Error("invalid response"), { errors: [{ path: ["email"], value: "x" }] });
    expect(describeError(validation)).toBe("Error: invalid response");
  });

  test("hostile getters and unprintable values never make describeError or classifyFailure throw (#9 item 7)", () => {
    const hostile = new Error("outer");
    Object.defineProperty(hostile, "cause", {
      get() {
        throw new Error("getter exploded");
      },
    });
    expect(describeError(hostile)).toBe("Error: outer");
    expect(classifyFailure(hostile).failureClass).toBe("transient");
    const revoked = Proxy.revocable({}, {});
    revoked.revoke();
    expect(typeof describeError(revoked.proxy)).toBe("string");
    expect(classifyFailure(revoked.proxy).failureClass).toBe("transient");
    const bigint = {
      n: 1n,
      [Symbol.toPrimitive]: () => {
        throw new Error("no");
      },
    };
    expect(describeError(bigint)).toMatch(/^non-error thrown: /);
    const nameThrows = new Error("x");
    Object.defineProperty(nameThrows, "name", {
      get: () => ({
        toString: () => {
          throw new Error("no");
        },
      }),
    });
    expect(typeof describeError(nameThrows)).toBe("string");
    expect(describeError(new Error("a", { cause: new Error("b", { cause: "root cause text" }) }))).toBe(
      "Error: a ← caused by Error: b ← caused by root cause text",
    );
  });
});
