/**
 * #20 item 1: limit definitions and the in-process limiter's buckets — one
 * token every per / rate, size 1 (no window of `per` holds more than `rate`),
 * all or none, blocks that only grow.
 */
import { describe, expect, test } from "vitest";
import { InvalidConfigError } from "../errors.ts";
import { inProcessRateLimiter } from "./in-process.ts";
import { bucketsOf, checkLimits, perTenant, provider } from "./limits.ts";

describe("limit definitions", () => {
  test("windows read as milliseconds or with a unit; bad rates, windows and names are refused with what is wrong", () => {
    expect(provider("resend", { rate: 10, per: "1s" })).toEqual({
      scope: "provider",
      name: "resend",
      rate: 10,
      perMs: 1_000,
    });
    expect(perTenant({ rate: 2, per: "500ms" })).toEqual({ scope: "tenant", name: "", rate: 2, perMs: 500 });
    expect(perTenant({ rate: 60, per: "1m" }, { name: "mail" }).perMs).toBe(60_000);
    expect(provider("x", { rate: 1, per: 250 }).perMs).toBe(250);
    for (const bad of [
      () => provider("Resend Inc", { rate: 10, per: "1s" }),
      () => provider("resend", { rate: 0, per: "1s" }),
      () => provider("resend", { rate: 1.5, per: "1s" }),
      () => provider("resend", { rate: 10, per: "1 week" }),
      () => provider("resend", { rate: 10, per: 0 }),
      () => provider("resend", { rate: 5_000, per: "1s" }), // more than one a millisecond
      () => perTenant({ rate: 2, per: "2d" }),
      () => checkLimits([provider("a", { rate: 1, per: "1s" }), provider("a", { rate: 2, per: "1s" })], "c"),
      () => checkLimits([perTenant({ rate: 1, per: "1s" }), perTenant({ rate: 2, per: "1s" })], "c"),
      () => checkLimits([{ scope: "other" }], "c"),
      () => checkLimits("resend", "c"),
    ]) {
      expect(bad).toThrow(InvalidConfigError);
    }
  });

  test("a delivery takes its tenant's bucket first, then each provider's; a tenant bucket is the consumer's own unless shared by name", () => {
    const limits = [provider("resend", { rate: 10, per: "1s" }), perTenant({ rate: 2, per: "1s" })];
    expect(bucketsOf(limits, "notif.email", "acme").map((b) => b.key)).toEqual([
      "tenant:notif.email:acme",
      "provider:resend",
    ]);
    expect(bucketsOf([perTenant({ rate: 2, per: "1s" }, { name: "mail" })], "c", "acme")[0]?.key).toBe(
      "tenant:mail:acme",
    );
  });
});

describe("the in-process limiter", () => {
  const clock = () => {
    let t = 1_000_000;
    return { now: () => t, advance: (ms: number) => (t += ms) };
  };

  test("one token every per / rate: no window of `per` ever holds more than `rate`, and a bucket left alone does not pile up tokens", async () => {
    const c = clock();
    const limiter = inProcessRateLimiter({ now: c.now });
    const bucket = { key: "provider:p", rate: 10, perMs: 1_000 };
    const granted: number[] = [];
    // Asked every 7 ms for 3 s.
    for (let t = 0; t < 3_000; t += 7) {
      if ((await limiter.take([bucket])).ok) granted.push(c.now());
      c.advance(7);
    }
    for (const start of granted)
      expect(granted.filter((g) => g >= start && g < start + 1_000).length).toBeLessThanOrEqual(10);
    expect(granted.length).toBeGreaterThanOrEqual(29);
    // Idle for 10 s: still one token, not a hundred.
    c.advance(10_000);
    expect((await limiter.take([bucket])).ok).toBe(true);
    expect(await limiter.take([bucket])).toEqual({ ok: false, bucket: "provider:p", retryAfterMs: 100 });
  });

  test("all or none: when the provider refuses, the tenant's token is not spent", async () => {
    const c = clock();
    const limiter = inProcessRateLimiter({ now: c.now });
    const tenant = { key: "tenant:c:acme", rate: 1, perMs: 1_000 };
    const shared = { key: "provider:p", rate: 1, perMs: 1_000 };
    expect((await limiter.take([{ key: "tenant:c:other", rate: 1, perMs: 1_000 }, shared])).ok).toBe(true);
    expect(await limiter.take([tenant, shared])).toMatchObject({ ok: false, bucket: "provider:p" });
    expect((await limiter.take([tenant])).ok).toBe(true);
    expect((await limiter.take([tenant])).ok).toBe(false);
  });

  test("a block refuses until it ends, and a shorter block never shortens a longer one", async () => {
    const c = clock();
    const limiter = inProcessRateLimiter({ now: c.now });
    const bucket = { key: "provider:p", rate: 100, perMs: 1_000 };
    await limiter.block(bucket, 30_000);
    await limiter.block(bucket, 1_000);
    expect(await limiter.take([bucket])).toEqual({ ok: false, bucket: "provider:p", retryAfterMs: 30_000 });
    c.advance(29_999);
    expect((await limiter.take([bucket])).ok).toBe(false);
    c.advance(1);
    expect((await limiter.take([bucket])).ok).toBe(true);
  });
});
