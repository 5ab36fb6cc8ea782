/**
 * The points-award consumer the Vercel adapter tests run: each test file gets
 * its own consumer (and queue) per call, crediting one effect row per job.
 */
import type { TestDatabase } from "@softcrum/testing";
import { eq } from "drizzle-orm";
import { z } from "zod";
import { bindConsumer, defineConsumer, type HandlerContext } from "../src/consumer.ts";
import { deadLetters } from "../src/db/schema.ts";
import { createEnvelope, type Envelope } from "../src/envelope.ts";
import { RateLimitedError } from "../src/errors.ts";
import { effects, silentLogger } from "./fixtures.ts";

export const pointsSchema = z.object({ customerId: z.string().min(1), points: z.number().int().positive() });

export const award = (points = 10, customerId = "c-1"): Envelope =>
  createEnvelope({ tenantId: "tenant-a", kind: "points.award.v1", data: { customerId, points } });

/** Jitter fixed at the middle, so backoffs are predictable. */
export const random = () => 0.5;

/** Consumers named `<prefix>.award-N` on queues `<prefix>.points.qN`, their rows in `pg`. */
export function pointsFixture(pg: TestDatabase, prefix: string) {
  let seq = 0;
  /** A consumer crediting one effect row per job; `before` runs first in the work transaction (throw to fail). */
  function pointsConsumer(before: (ctx: HandlerContext) => Promise<void> | void = () => {}) {
    seq += 1;
    const name = `${prefix}.award-${seq}`;
    return defineConsumer({
      name,
      queue: `${prefix}.points.q${seq}`,
      kind: "points.award.v1",
      schema: pointsSchema,
      async handle(data, ctx) {
        await before(ctx);
        await ctx.tx.insert(effects).values({ jobId: ctx.envelope.job_id, consumer: name, amount: data.points });
      },
    });
  }
  /** A consumer whose first `times` runs are rate-limited (20 s), recording each run's attempt. */
  function rateLimitedConsumer(times: number, message = "429") {
    const attempts: number[] = [];
    let limited = times;
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (limited-- > 0) throw new RateLimitedError(message, { retryAfterMs: 20_000 });
    });
    return { consumer, attempts };
  }
  return {
    pointsConsumer,
    rateLimitedConsumer,
    bind: (consumer: ReturnType<typeof pointsConsumer>) =>
      bindConsumer(consumer, { db: pg.db, logger: silentLogger, random }),
    effectRows: (consumer: string) => pg.db.select().from(effects).where(eq(effects.consumer, consumer)),
    letters: (consumer: string) => pg.db.select().from(deadLetters).where(eq(deadLetters.consumer, consumer)),
  };
}
