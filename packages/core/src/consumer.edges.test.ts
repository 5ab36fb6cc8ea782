/**
 * Deliveries at the edges a second reader found (2026-12-04): counts the
 * transport got wrong, thrown values that throw when read, bytes with a BOM,
 * a poison copy of a job that committed, and copies that fold into a pending
 * letter. Each case failed before its fix. On real Postgres.
 */
import { describe, expect, test, vi } from "vitest";
import { z } from "zod";
import { recordingAlerts, silentLogger, useEffectsDatabase } from "../test/fixtures.ts";
import { bindConsumer, type ConsumerDefinition, defineConsumer } from "./consumer.ts";
import { createEnvelope } from "./envelope.ts";
import { PermanentError, RateLimitedError } from "./errors.ts";
import { inProcessRateLimiter } from "./limits/in-process.ts";
import { perTenant, provider } from "./limits/limits.ts";
import type { RateLimiter } from "./limits/port.ts";

const pg = useEffectsDatabase("consumer_edges");
const schema = z.object({ customerId: z.string().min(1), points: z.number().int().positive() });
type Handle = ConsumerDefinition<typeof schema>["handle"];

let seq = 0;
function consumerOf(handle: Handle, extra: Partial<ConsumerDefinition<typeof schema>> = {}) {
  seq += 1;
  return defineConsumer({
    name: `edges.c${seq}`,
    queue: `edges.q${seq}`,
    kind: "points.award.v1",
    schema,
    handle,
    ...extra,
  });
}
const envelope = () => createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 1 } });
const body = () => JSON.stringify(envelope());
const lettersOf = (consumer: string) =>
  pg.sql<{ status: string; attempts: number; last_error: string; error_class: string; occurrences: number }[]>`
    select status, attempts, last_error, error_class, occurrences from core.dead_letters where consumer = ${consumer}`;
const fencesOf = (consumer: string) => pg.sql`select 1 from core.processed_jobs where consumer = ${consumer}`;

describe("counts a transport got wrong", () => {
  test("a delivery count past the attempts column's range is still dead-lettered and acknowledged, once", async () => {
    const consumer = consumerOf(async () => {});
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const result = await bound.deliver({ body: body(), deliveryCount: 3_000_000_000 });
    expect(result).toMatchObject({ outcome: "dead_lettered", ack: true, errorClass: "exhausted" });
    const [letter] = await lettersOf(consumer.name);
    expect(letter?.attempts).toBe(2_147_483_647);
  });

  test.each([Number.NaN, -3, 1.5, Number.POSITIVE_INFINITY])(
    "deferrals %s: a delivery its rate limit does not admit waits a real, positive time",
    async (deferrals) => {
      const consumer = consumerOf(async () => {}, { limits: [perTenant({ rate: 1, per: 60_000 })] });
      const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, rateLimiter: inProcessRateLimiter() });
      expect((await bound.deliver({ body: body(), deliveryCount: 1 })).outcome).toBe("success");
      const limited = await bound.deliver({ body: body(), deliveryCount: 1, deferrals });
      if (limited.outcome !== "rate_limited") throw new Error(`expected rate_limited, got ${limited.outcome}`);
      expect(Number.isFinite(limited.retryAfterMs)).toBe(true);
      expect(limited.retryAfterMs).toBeGreaterThan(0);
    },
  );
});

describe("thrown values that throw when read", () => {
  test("a permanent error whose cause getter throws: deliver() resolves, the letter is written and alerted once", async () => {
    class Hostile extends PermanentError {
      override get cause(): unknown {
        throw new Error("getter boom");
      }
    }
    const alerts = recordingAlerts();
    const consumer = consumerOf(async () => {
      throw new Hostile("account closed");
    });
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, alerts: alerts.port });
    const result = await bound.deliver({ body: body(), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "dead_lettered", ack: true, errorClass: "permanent" });
    await bound.flushAlerts?.();
    expect(alerts.sent).toHaveLength(1);
    expect(alerts.sent[0]?.error).toContain("account closed");
  });

  test("a thrown Proxy whose prototype cannot be read: deliver() resolves with a retry, nothing committed", async () => {
    const consumer = consumerOf(async () => {
      throw new Proxy(
        {},
        {
          getPrototypeOf() {
            throw new Error("proto boom");
          },
        },
      );
    });
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const result = await bound.deliver({ body: body(), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "retry", ack: false, spendsAttempt: true });
    expect(await fencesOf(consumer.name)).toHaveLength(0);
  });
});

describe("payload bytes", () => {
  test("bytes that start with a UTF-8 BOM are kept as received, and read as the same string would be (poison)", async () => {
    const consumer = consumerOf(async () => {});
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const text = body();
    const bytes = new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode(text)]);
    expect((await bound.deliver({ body: bytes, deliveryCount: 1 })).outcome).toBe("poison");
    expect((await bound.deliver({ body: `\uFEFF${text}`, deliveryCount: 1 })).outcome).toBe("poison");
    const [letter] = await pg.sql<{ payload: string; payload_encoding: "utf8" | "base64"; occurrences: number }[]>`
      select payload, payload_encoding, occurrences from core.dead_letters where consumer = ${consumer.name}`;
    expect(Buffer.from(letter?.payload ?? "", letter?.payload_encoding).equals(Buffer.from(bytes))).toBe(true);
    // The string with a BOM is the same bytes: the same letter.
    expect(letter?.occurrences).toBe(2);
    expect(await fencesOf(consumer.name)).toHaveLength(0);
  });
});

describe("never a committed fence beside a pending letter", () => {
  test("a poison copy of a job that committed is a duplicate: no pending letter beside the fence", async () => {
    const consumer = consumerOf(async () => {});
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const job = envelope();
    expect((await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 })).outcome).toBe("success");
    const corrupted = JSON.stringify({ ...job, data: { customerId: "c", points: 0 } });
    expect(await bound.deliver({ body: corrupted, deliveryCount: 2 })).toMatchObject({
      outcome: "duplicate",
      ack: true,
    });
    expect(await fencesOf(consumer.name)).toHaveLength(1);
    expect(await lettersOf(consumer.name)).toEqual([]);
  });

  test("a poison copy of a job that never committed is still a poison letter, alerted once", async () => {
    const alerts = recordingAlerts();
    const consumer = consumerOf(async () => {});
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, alerts: alerts.port });
    const corrupted = JSON.stringify({ ...envelope(), data: { customerId: "c", points: 0 } });
    expect(await bound.deliver({ body: corrupted, deliveryCount: 1 })).toMatchObject({ outcome: "poison", ack: true });
    expect(await bound.deliver({ body: corrupted, deliveryCount: 2 })).toMatchObject({ outcome: "poison", ack: true });
    await bound.flushAlerts?.();
    expect(alerts.sent).toHaveLength(1);
    expect(await lettersOf(consumer.name)).toMatchObject([
      { status: "pending_review", error_class: "poison", occurrences: 2 },
    ]);
    expect(await fencesOf(consumer.name)).toHaveLength(0);
  });
});

describe("copies folded into a pending letter keep its evidence", () => {
  test("a copy past the budget after a lost ack keeps the letter's real error and attempts", async () => {
    const consumer = consumerOf(async () => {
      throw new Error("account 42 is frozen");
    });
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const text = body();
    expect((await bound.deliver({ body: text, deliveryCount: 5 })).outcome).toBe("dead_lettered");
    expect((await bound.deliver({ body: text, deliveryCount: 6 })).outcome).toBe("dead_lettered");
    const [letter] = await lettersOf(consumer.name);
    expect(letter).toMatchObject({ attempts: 5, error_class: "exhausted", occurrences: 2 });
    expect(letter?.last_error).toContain("frozen");
  });

  test("an expired copy of a job rejected as permanent never lowers attempts nor contradicts its class", async () => {
    const consumer = consumerOf(
      async () => {
        throw new PermanentError("account closed");
      },
      { maxAgeMs: 60_000 },
    );
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    const text = body();
    expect((await bound.deliver({ body: text, deliveryCount: 1, dueAt: Date.now() })).outcome).toBe("dead_lettered");
    const late = await bound.deliver({ body: text, deliveryCount: 1, dueAt: Date.now() - 3_600_000 });
    expect(late.outcome).toBe("dead_lettered");
    const [letter] = await lettersOf(consumer.name);
    expect(letter).toMatchObject({ attempts: 1, error_class: "permanent", occurrences: 2 });
    expect(letter?.last_error).toContain("account closed");
  });
});

describe("a dead-letter decision that commits after the delivery gave up on it", () => {
  test("the letter it committed late is new and alerts once; the redelivery finds it and alerts nothing more", async () => {
    // COMMIT runs the deferred trigger: the decision's COMMIT outlasts timeoutMs (a slow flush, a lagging standby).
    await pg.sql.unsafe(`create function public.slow_letter() returns trigger language plpgsql as $$
      begin perform pg_sleep(1.5); return null; end $$`);
    await pg.sql.unsafe(`create constraint trigger slow_letter after insert on core.dead_letters
      deferrable initially deferred for each row execute function public.slow_letter()`);
    try {
      const alerts = recordingAlerts();
      const consumer = consumerOf(
        async () => {
          throw new PermanentError("account closed");
        },
        { timeoutMs: 1_000 },
      );
      const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, alerts: alerts.port });
      const text = body();
      expect(await bound.deliver({ body: text, deliveryCount: 1 })).toMatchObject({
        outcome: "dead_letter_failed",
        ack: false,
      });
      await vi.waitFor(() => expect(alerts.sent).toHaveLength(1), { timeout: 10_000, interval: 50 });
      expect(alerts.sent[0]).toMatchObject({ consumer: consumer.name, errorClass: "permanent" });
      expect(await lettersOf(consumer.name)).toMatchObject([{ status: "pending_review", error_class: "permanent" }]);
      expect(await bound.deliver({ body: text, deliveryCount: 2 })).toMatchObject({
        outcome: "dead_lettered",
        ack: true,
      });
      await bound.flushAlerts?.();
      expect(alerts.sent).toHaveLength(1);
    } finally {
      await pg.sql.unsafe("drop trigger slow_letter on core.dead_letters");
      await pg.sql.unsafe("drop function public.slow_letter()");
    }
  });
});

describe("one budget outside the work transaction, so a delivery ends within deliveryBoundMs", () => {
  test("a schema whose asynchronous check never settles: the payload is poison once timeoutMs is spent, not a delivery that never ends", async () => {
    seq += 1;
    const hanging = defineConsumer({
      name: `edges.c${seq}`,
      queue: `edges.q${seq}`,
      kind: "points.award.v1",
      schema: schema.refine(() => new Promise<boolean>(() => {})),
      timeoutMs: 300,
      handle: async () => {},
    });
    const bound = bindConsumer(hanging, { db: pg.db, logger: silentLogger });
    const result = await bound.deliver({ body: body(), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    const [letter] = await lettersOf(hanging.name);
    expect(letter?.last_error).toContain("did not finish within");
  });

  test("a limiter that answers late, a 429 near the handler's timeout and a limiter that never hears of it: the delivery still ends within deliveryBoundMs", async () => {
    const T = 10_000;
    const limiter: RateLimiter = {
      async take() {
        await new Promise((resolve) => setTimeout(resolve, 0.95 * T));
        return { ok: true };
      },
      block: () => new Promise<void>(() => {}),
    };
    const consumer = consumerOf(
      async () => {
        await new Promise((resolve) => setTimeout(resolve, 0.9 * T));
        throw new RateLimitedError("429 from the provider", { retryAfterMs: 1_000 });
      },
      { timeoutMs: T, limits: [provider("mail", { rate: 10, per: 1_000 })] },
    );
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, rateLimiter: limiter });
    const started = performance.now();
    const result = await bound.deliver({ body: body(), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "rate_limited", ack: false, spendsAttempt: false });
    // Was 28.5 s: the limiter's take (9.5 s), the handler (9 s), then a whole timeoutMs for the block.
    expect(performance.now() - started).toBeLessThan(bound.deliveryBoundMs ?? Number.NaN);
  }, 60_000);
});
