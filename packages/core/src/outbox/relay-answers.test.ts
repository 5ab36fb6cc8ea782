/**
 * #19: the outbox relay is a republishing path like the others. A row is
 * marked published only when the transport says its message is stored (Vercel
 * Queues: 201 with an id); a 202 ("accepted for deferred processing", no id),
 * a 429 or a 5xx leaves the row for a later pass — publishing it again is
 * safe, the copy keeps its job_id and the consumer's fence absorbs it. And a
 * batch's transaction has one bound for all its publishes. Through the real
 * SDK against the fake service, push and poll.
 */
import { afterAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { vercelHarness } from "../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import type { PublishReceipt, QueuePort } from "../queue-port.ts";
import { createOutboxRelay } from "./index.ts";
import { outboxIn } from "./writer.ts";

const pg = useEffectsDatabase("outbox_answers", "test_effects, core.processed_jobs, core.dead_letters, core.outbox");
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

let seq = 0;
function notifyConsumer() {
  seq += 1;
  const name = `relay.notify-${seq}`;
  return defineConsumer({
    name,
    queue: `relay.notify.q${seq}`,
    kind: "partner.notify.v1",
    schema: z.object({ points: z.number() }),
    async handle(data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: data.points });
    },
  });
}
const notification = (points: number) =>
  createEnvelope({ tenantId: "acme", kind: "partner.notify.v1", data: { points } });

async function rows() {
  return pg.sql<{ published: boolean; message_id: string | null; attempts: number; last_error: string | null }[]>`
    select published_at is not null as published, message_id, attempts, last_error from core.outbox order by id`;
}
async function effectsOf(consumer: string) {
  const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects where consumer = ${consumer}`;
  return row?.n;
}

describe.each(["push", "poll"] as const)("the relay over Vercel Queues (%s)", (mode) => {
  async function setUp() {
    const h = await vercelHarness(mode);
    closers.push(() => h.close());
    const consumer = notifyConsumer();
    h.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
    await pg.db.transaction((tx) => outboxIn(tx).publish(consumer.queue, notification(5)));
    const relay = createOutboxRelay({ db: pg.db, queue: h.queue, logger: silentLogger, random: () => 0 });
    return { h, consumer, relay };
  }

  test("a publish answered 202 that is never stored leaves the row unpublished; the next pass publishes it and the job is applied once", async () => {
    const { h, consumer, relay } = await setUp();
    h.fake.failNextSends({ status: 202, store: false });
    expect(await relay.run()).toMatchObject({ published: 0, unconfirmed: 1 });
    expect(await rows()).toEqual([
      expect.objectContaining({ published: false, attempts: 1, last_error: expect.stringMatching(/not confirmed/) }),
    ]);
    await h.settle();
    expect(await effectsOf(consumer.name)).toBe(0);
    await pg.sql`update core.outbox set available_at = now()`;
    expect(await relay.run()).toMatchObject({ published: 1 });
    await h.settle();
    expect(await effectsOf(consumer.name)).toBe(1);
    expect(await rows()).toEqual([expect.objectContaining({ published: true, message_id: expect.any(String) })]);
  });

  test("a publish answered 202 that the service stores later: published again, applied once (the fence absorbs the copy)", async () => {
    const { h, consumer, relay } = await setUp();
    h.fake.failNextSends({ status: 202 });
    expect(await relay.run()).toMatchObject({ published: 0, unconfirmed: 1 });
    await pg.sql`update core.outbox set available_at = now()`;
    expect(await relay.run()).toMatchObject({ published: 1 });
    await h.settle();
    expect(await effectsOf(consumer.name)).toBe(1);
  });

  for (const [label, fault] of [
    ["429 with Retry-After", { status: 429, retryAfter: 30 }],
    ["500", { status: 500 }],
    ["502 consumer_discovery_failed", { status: 502, errorCode: "consumer_discovery_failed" }],
    ["503", { status: 503 }],
    ["connection lost before storing", { status: 201, dropConnection: "before" as const }],
    ["connection lost after storing", { status: 201, dropConnection: "after" as const }],
  ] as const) {
    test(`a publish answered ${label} leaves the row for a later pass; the job is applied once`, async () => {
      const { h, consumer, relay } = await setUp();
      h.fake.failNextSends(fault);
      expect(await relay.run()).toMatchObject({ published: 0, failed: 1 });
      expect(await rows()).toEqual([expect.objectContaining({ published: false, attempts: 1 })]);
      await pg.sql`update core.outbox set available_at = now()`;
      expect(await relay.run()).toMatchObject({ published: 1 });
      await h.settle();
      expect(await effectsOf(consumer.name)).toBe(1);
    });
  }
});

describe("the relay's batch transaction", () => {
  test("has one bound for the whole batch: a transport that hangs is given publishTimeoutMs once, the rows it did not reach stay due, untouched", async () => {
    const queue = "relay.hang.q";
    await pg.db.transaction(async (tx) => {
      for (let i = 0; i < 5; i++) await outboxIn(tx).publish(queue, notification(i));
    });
    let calls = 0;
    const hanging: Pick<QueuePort, "publish"> = {
      publish: () => {
        calls += 1;
        return new Promise<PublishReceipt>(() => {});
      },
    };
    const relay = createOutboxRelay({
      db: pg.db,
      queue: hanging,
      batchSize: 5,
      publishTimeoutMs: 300,
      logger: silentLogger,
    });
    expect(await relay.run({ maxBatches: 1 })).toMatchObject({ published: 0, failed: 1 });
    expect(calls).toBe(1);
    const after = await pg.sql<{ attempts: number; due: boolean }[]>`
      select attempts, available_at <= now() as due from core.outbox order by id`;
    expect(after).toEqual([
      { attempts: 1, due: false },
      ...Array.from({ length: 4 }, () => ({ attempts: 0, due: true })),
    ]);
  });
});

describe("an envelope the transport can never carry", () => {
  test("an outbox row too large for Vercel Queues (InvalidEnvelopeError on publish) is parked with its error and an error log, not retried forever", async () => {
    const h = await vercelHarness("poll", { maxMessageBytes: 4096 });
    closers.push(() => h.close());
    const consumer = notifyConsumer();
    h.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
    // outboxIn accepts it (a valid envelope of ~5 KB): only the transport knows its limit.
    const big = createEnvelope({
      tenantId: "acme",
      kind: "partner.notify.v1",
      data: { points: 1, note: "x".repeat(5_000) },
    });
    await pg.db.transaction((tx) => outboxIn(tx).publish(consumer.queue, big));
    let publishes = 0;
    const counting: Pick<QueuePort, "publish"> = {
      publish(...args) {
        publishes += 1;
        return h.queue.publish(...args);
      },
    };
    const lines: string[] = [];
    const relay = createOutboxRelay({
      db: pg.db,
      queue: counting,
      random: () => 0,
      logger: { warn: (m) => lines.push(`warn ${m}`), error: (m) => lines.push(`error ${m}`) },
    });
    expect(await relay.run()).toMatchObject({ published: 0, failed: 0, parked: 1 });
    // Even when every row is due again (the runbook's "send at once" leaves it parked).
    await pg.sql`update core.outbox set available_at = now()
                 where published_at is null and attempts > 0 and available_at <> 'infinity'`;
    expect(await relay.run()).toMatchObject({ published: 0, failed: 0, parked: 0 });
    expect(publishes).toBe(1);
    expect(await rows()).toEqual([
      expect.objectContaining({
        published: false,
        attempts: 1,
        last_error: expect.stringMatching(/^parked, .*InvalidEnvelopeError.*bytes/),
      }),
    ]);
    expect(lines).toEqual([expect.stringMatching(/^error outbox relay: row .* parked: .*InvalidEnvelopeError/)]);
    await h.settle();
    expect(await effectsOf(consumer.name)).toBe(0);
  });
});
