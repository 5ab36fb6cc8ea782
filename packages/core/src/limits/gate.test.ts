/**
 * #20 item 1: a consumer's limits in the harness, on real Postgres. A
 * delivery without a token takes no connection, lock or fence, is deferred to
 * the bucket's next token without spending an attempt, and is never
 * dead-lettered; a limiter that cannot answer defers (never a pass-through);
 * a provider's 429 makes the provider's bucket wait for every delivery at once.
 */
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { silentLogger, testConsumers, useEffectsDatabase } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { InvalidConfigError, RateLimitedError } from "../errors.ts";
import { inProcessRateLimiter } from "./in-process.ts";
import { perTenant, provider } from "./limits.ts";
import type { RateLimiter } from "./port.ts";

const pg = useEffectsDatabase("rate_limits");
const consumer = testConsumers("limits");
const job = (n: number, tenantId = "acme") => createEnvelope({ tenantId, kind: "test.v1", data: { n } });
const body = (e: ReturnType<typeof job>) => JSON.stringify(e);
const fences = async (name: string) =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs where consumer = ${name}`)[0]?.n;

describe("rate limits in the harness", () => {
  test("a consumer that declares limits cannot be bound without a rate limiter", () => {
    const c = consumer(async () => {}, { limits: [provider("resend", { rate: 10, per: "1s" })] });
    expect(() => bindConsumer(c, { db: pg.db, logger: silentLogger })).toThrow(InvalidConfigError);
  });

  test("no token: rate_limited to the bucket's next token, no attempt spent, and nothing taken from the database — it answers while the pool's only connection is busy", async () => {
    const client = postgres(pg.url, { max: 1, onnotice: () => {} });
    try {
      const db = drizzle({ client });
      let runs = 0;
      const c = consumer(
        async () => {
          runs += 1;
        },
        { limits: [provider("p-one", { rate: 1, per: "10s" })] },
      );
      const bound = bindConsumer(c, { db, logger: silentLogger, rateLimiter: inProcessRateLimiter(), random: () => 0 });
      expect(await bound.deliver({ body: body(job(1)), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
      // The pool's one connection is held elsewhere from now on.
      let released = false;
      const holding = db.transaction(async (tx) => {
        await tx.execute(sql`select pg_sleep(1)`);
        released = true;
      });
      await new Promise((r) => setTimeout(r, 100));
      const second = await bound.deliver({ body: body(job(2)), deliveryCount: 1 });
      expect(released).toBe(false);
      expect(second).toMatchObject({ outcome: "rate_limited", ack: false, spendsAttempt: false });
      expect(second.ack === false && "retryAfterMs" in second && second.retryAfterMs).toBeGreaterThan(9_000);
      expect(second.ack === false && "retryAfterMs" in second && second.retryAfterMs).toBeLessThanOrEqual(10_000);
      await holding;
      expect(runs).toBe(1);
      expect(await fences(c.name)).toBe(1);
    } finally {
      await client.end();
    }
  });

  test("a limiter that fails or does not answer within timeoutMs defers the delivery (deferred, no attempt), never lets it through", async () => {
    let runs = 0;
    const failing: RateLimiter = {
      take: () => Promise.reject(new Error("ECONNREFUSED 127.0.0.1:6379")),
      block: async () => {},
    };
    const hanging: RateLimiter = { take: () => new Promise(() => {}), block: async () => {} };
    for (const rateLimiter of [failing, hanging]) {
      const c = consumer(
        async () => {
          runs += 1;
        },
        { limits: [perTenant({ rate: 5, per: "1s" })], timeoutMs: 300 },
      );
      const bound = bindConsumer(c, { db: pg.db, logger: silentLogger, rateLimiter });
      const result = await bound.deliver({ body: body(job(3)), deliveryCount: 1 });
      expect(result).toMatchObject({ outcome: "deferred", ack: false, spendsAttempt: false });
      expect("error" in result && result.error).toMatch(/rate limiter unavailable/);
      expect(await fences(c.name)).toBe(0);
    }
    expect(runs).toBe(0);
  });

  test("a provider's 429 from the handler blocks that provider's bucket: the next delivery, of another tenant, waits without running", async () => {
    const limiter = inProcessRateLimiter();
    let runs = 0;
    const c = consumer(
      async () => {
        runs += 1;
        if (runs === 1) throw new RateLimitedError("resend 429", { retryAfterMs: 30_000 });
      },
      { limits: [provider("p-429", { rate: 100, per: "1s" }), perTenant({ rate: 100, per: "1s" })] },
    );
    const bound = bindConsumer(c, { db: pg.db, logger: silentLogger, rateLimiter: limiter, random: () => 0 });
    expect(await bound.deliver({ body: body(job(4, "acme")), deliveryCount: 1 })).toMatchObject({
      outcome: "rate_limited",
      spendsAttempt: false,
    });
    const other = await bound.deliver({ body: body(job(5, "globex")), deliveryCount: 1 });
    expect(other).toMatchObject({ outcome: "rate_limited", spendsAttempt: false });
    expect("error" in other && other.error).toMatch(/provider:p-429/);
    expect(runs).toBe(1);
    // Another consumer naming the same provider waits too: the bucket is the provider's.
    const sibling = consumer(async () => {}, { limits: [provider("p-429", { rate: 100, per: "1s" })] });
    const boundSibling = bindConsumer(sibling, { db: pg.db, logger: silentLogger, rateLimiter: limiter });
    expect(await boundSibling.deliver({ body: body(job(6)), deliveryCount: 1 })).toMatchObject({
      outcome: "rate_limited",
    });
  });

  test("one tenant flooding takes no more than its share: another tenant's jobs keep flowing", async () => {
    const limiter = inProcessRateLimiter();
    const applied: string[] = [];
    const c = consumer(
      async (_data, ctx) => {
        applied.push(ctx.envelope.tenant_id);
      },
      { limits: [provider("p-fair", { rate: 1_000, per: "1s" }), perTenant({ rate: 1, per: "10s" })] },
    );
    const bound = bindConsumer(c, { db: pg.db, logger: silentLogger, rateLimiter: limiter, random: () => 0 });
    const outcomes: string[] = [];
    for (let i = 0; i < 20; i++)
      outcomes.push((await bound.deliver({ body: body(job(100 + i, "flood")), deliveryCount: 1 })).outcome);
    const quiet = await bound.deliver({ body: body(job(200, "quiet")), deliveryCount: 1 });
    expect(outcomes.filter((o) => o === "success")).toHaveLength(1);
    expect(outcomes.filter((o) => o === "rate_limited")).toHaveLength(19);
    expect(quiet.outcome).toBe("success");
    expect(applied).toEqual(["flood", "quiet"]);
  });
});
