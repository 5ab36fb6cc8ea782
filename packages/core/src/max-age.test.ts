/**
 * `maxAgeMs` counts from when the job was due (#8 item 10), through the real
 * adapters (in-process; Vercel Queues push and poll against the fake server)
 * and the real harness on Postgres, on the transports' manual clocks.
 */
import { eq } from "drizzle-orm";
import { afterEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../test/fixtures.ts";
import { vercelHarness } from "../test/vercel-transport.ts";
import { createMemoryQueue } from "./adapters/memory/index.ts";
import { toVercelTopic } from "./adapters/vercel/index.ts";
import { createManualClock } from "./clock.ts";
import { bindConsumer, defineConsumer, type HandlerContext } from "./consumer.ts";
import { deadLetters } from "./db/schema.ts";
import { createEnvelope } from "./envelope.ts";
import { RateLimitedError } from "./errors.ts";
import { createOps } from "./ops/index.ts";
import type { BoundConsumer, QueuePort } from "./queue-port.ts";

const pg = useEffectsDatabase("max-age");

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/** An adapter on a manual clock that the harness shares. */
interface Transport {
  readonly port: QueuePort;
  subscribe(consumer: BoundConsumer): void;
  /** Runs every delivery due up to `horizonMs` ahead, moving the clock. */
  settle(horizonMs?: number): Promise<void>;
  now(): number;
  /** Time passes with nobody receiving (a worker outage). */
  advance(ms: number): void;
  close(): Promise<void>;
}

const transports: [string, () => Promise<Transport>][] = [
  [
    "in-process",
    async () => {
      const clock = createManualClock();
      const queue = createMemoryQueue({ clock });
      return {
        port: queue,
        subscribe: (c) => queue.subscribe(c),
        settle: () => queue.drain(),
        now: () => clock.now(),
        advance: (ms) => clock.advance(ms),
        close: () => queue.close(),
      };
    },
  ],
  ...(["push", "poll"] as const).map((mode): [string, () => Promise<Transport>] => [
    `Vercel Queues, ${mode}`,
    async () => {
      const h = await vercelHarness(mode);
      return {
        port: h.port,
        subscribe: (c) => h.subscribe(c),
        settle: (horizonMs) => h.settle(horizonMs),
        now: () => h.now(),
        advance: (ms) => h.fake.clock.advance(ms),
        close: () => h.close(),
      };
    },
  ]),
];

let seq = 0;
/** A consumer with a 1 h maximum age crediting one effect row per job; `before` runs first (throw to fail). */
function expiringConsumer(before: (ctx: HandlerContext) => void = () => {}) {
  seq += 1;
  const name = `max-age.award-${seq}`;
  return defineConsumer({
    name,
    queue: `max-age.points.q${seq}`,
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    maxAgeMs: HOUR,
    async handle(data, ctx) {
      before(ctx);
      await ctx.tx.insert(effects).values({ jobId: ctx.envelope.job_id, consumer: name, amount: data.points });
    },
  });
}
const award = () => createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 5 } });
const effectJobs = async (consumer: string) =>
  (await pg.db.select().from(effects).where(eq(effects.consumer, consumer))).map((r) => r.jobId);
const letters = (consumer: string) => pg.db.select().from(deadLetters).where(eq(deadLetters.consumer, consumer));

describe.each(transports)("maxAgeMs on %s", (_name, open) => {
  let transport: Transport | undefined;
  afterEach(async () => {
    await transport?.close();
    transport = undefined;
  });
  const start = async () => {
    transport = await open();
    return transport;
  };
  const bind = (t: Transport, consumer: ReturnType<typeof expiringConsumer>) =>
    bindConsumer(consumer, { db: pg.db, logger: silentLogger, now: () => t.now(), random: () => 0.5 });

  test("a job scheduled 2 h ahead for a consumer with a 1 h maximum age runs when it comes due (#8 item 10)", async () => {
    const t = await start();
    const consumer = expiringConsumer();
    t.subscribe(bind(t, consumer));
    const envelope = award();
    await t.port.schedule(consumer.queue, envelope, new Date(t.now() + 2 * HOUR));
    await t.settle(3 * HOUR);
    expect(await effectJobs(consumer.name)).toEqual([envelope.job_id]);
    expect(await letters(consumer.name)).toEqual([]);
  });

  test("age counts from the due time: 61 min after it, a scheduled job is expired; 59 min after it, it runs (#8 item 10)", async () => {
    const t = await start();
    const consumer = expiringConsumer();
    const late = award();
    const inTime = award();
    await t.port.schedule(consumer.queue, late, new Date(t.now() + 2 * HOUR));
    await t.port.schedule(consumer.queue, inTime, new Date(t.now() + 2 * HOUR + 2 * MINUTE));
    // Nobody receives until 61 minutes after the first one came due.
    t.advance(2 * HOUR + 61 * MINUTE);
    t.subscribe(bind(t, consumer));
    await t.settle();
    expect(await effectJobs(consumer.name)).toEqual([inTime.job_id]);
    const rows = await letters(consumer.name);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ jobId: late.job_id, errorClass: "expired", attempts: 0 });
    expect(rows[0]?.lastError).toBe(
      `job has been due for ${61 * MINUTE} ms, past ${consumer.name}'s maximum age of ${HOUR} ms`,
    );
  });

  test("a replay of an expired letter runs, even after a rate-limit deferral: an operator asked for it (#8 item 10)", async () => {
    const t = await start();
    let runs = 0;
    const consumer = expiringConsumer(() => {
      runs += 1;
      // Longer than the maximum age: the deferred copy must still be known as a replay.
      if (runs === 1) throw new RateLimitedError("provider says wait", { retryAfterMs: 90 * MINUTE });
    });
    const envelope = award();
    await t.port.publish(consumer.queue, envelope);
    t.advance(2 * HOUR);
    t.subscribe(bind(t, consumer));
    await t.settle();
    const [letter] = await letters(consumer.name);
    expect(letter).toMatchObject({ errorClass: "expired", status: "pending_review" });

    const ops = createOps({ db: pg.db, queue: t.port, routes: [{ queue: consumer.queue, consumer: consumer.name }] });
    const report = await ops.deadLetters.replay([letter?.id as string], { operator: "ana", reason: "still wanted" });
    expect(report.counts).toEqual({ replayed: 1 });
    await t.settle(3 * HOUR);
    expect(runs).toBe(2);
    expect(await effectJobs(consumer.name)).toEqual([envelope.job_id]);
    const after = await letters(consumer.name);
    expect(after.map((l) => [l.id, l.status])).toEqual([[letter?.id, "replayed"]]);
  });

  test("a rate-limit deferral does not make a job younger: its age still counts from the original due time", async () => {
    const t = await start();
    let runs = 0;
    const consumer = expiringConsumer(() => {
      runs += 1;
      if (runs === 1) throw new RateLimitedError("provider says wait", { retryAfterMs: 90 * MINUTE });
    });
    t.subscribe(bind(t, consumer));
    const envelope = award();
    await t.port.publish(consumer.queue, envelope);
    await t.settle(3 * HOUR);
    expect(runs).toBe(1);
    expect(await effectJobs(consumer.name)).toEqual([]);
    const [letter] = await letters(consumer.name);
    expect(letter).toMatchObject({ jobId: envelope.job_id, errorClass: "expired" });
    expect(letter?.lastError).toMatch(/^job has been due for 5400000 ms,/);
  });
});

describe("maxAgeMs on Vercel Queues: a message another producer sent", () => {
  test("a lifetime that is not this adapter's (another retention) never makes a job due in the future (#8 item 10)", async () => {
    // This adapter keeps 1 h after the delay; the other producer kept the default day and sent no delay.
    const h = await vercelHarness("poll", { retentionSeconds: 3_600 });
    try {
      const consumer = expiringConsumer();
      const envelope = award();
      h.fake.inject(toVercelTopic(consumer.queue), JSON.stringify(envelope));
      h.fake.clock.advance(2 * HOUR);
      h.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger, now: () => h.now() }));
      await h.settle();
      expect(await effectJobs(consumer.name)).toEqual([]);
      const [letter] = await letters(consumer.name);
      expect(letter).toMatchObject({ jobId: envelope.job_id, errorClass: "expired" });
      expect(letter?.lastError).toMatch(/^job has been due for 7200000 ms,/);
    } finally {
      await h.close();
    }
  });
});
