import { fileURLToPath } from "node:url";
import { runScript } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { afterAll, beforeEach, describe, expect, test, vi } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { latch } from "../../test/latch.ts";
import { createMemoryQueue, type DeliveryEvent } from "../adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { InvalidConfigError, InvalidEnvelopeError, isSoftcrumError } from "../errors.ts";
import type { Logger } from "../ports/logger.ts";
import type { PublishReceipt, QueuePort } from "../queue-port.ts";
import { createOutboxRelay } from "./index.ts";
import { outboxIn } from "./writer.ts";

const pg = useEffectsDatabase("outbox", "test_effects, core.processed_jobs, core.dead_letters, core.outbox");
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});
beforeEach(() => {
  silentLogger.lines.length = 0;
});

const NOTIFY_QUEUE = "test.notify";
const NOTIFY_KIND = "partner.notify.v1";

/** The consumer of the relayed jobs: one effect row per applied job (no unique key, so a double effect shows). */
const notifyConsumer = defineConsumer({
  name: "test.notify-partner",
  queue: NOTIFY_QUEUE,
  kind: NOTIFY_KIND,
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "test.notify-partner", amount: data.points });
  },
});

/** The producing consumer: credits, then publishes a notification job in its transaction, then maybe fails. */
function awardConsumer(failAfterOutbox: boolean) {
  return defineConsumer({
    name: "test.award",
    queue: "test.award",
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    async handle(data, { tx, envelope, outbox }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "test.award", amount: data.points });
      await outbox.publish(NOTIFY_QUEUE, notification(data.points, envelope.job_id));
      if (failAfterOutbox) throw new Error("COMMIT never happens: the handler failed after writing the outbox");
    },
  });
}

function notification(points: number, correlationId?: string): Envelope {
  return createEnvelope({
    tenantId: "acme",
    kind: NOTIFY_KIND,
    data: { customerId: "c-1", points },
    ...(correlationId ? { correlationId } : {}),
  });
}

/** A pool of its own (closed after the file), named so a test can find and kill its backend. */
function connect(applicationName: string, max = 2, settings: Record<string, string | number> = {}) {
  const client = postgres(pg.url, {
    max,
    onnotice: () => {},
    connection: { application_name: applicationName, ...settings },
  });
  closers.push(() => client.end({ timeout: 5 }));
  return drizzle({ client });
}

async function outboxRows() {
  return pg.sql<{ job_id: string; published: boolean; attempts: number; last_error: string | null }[]>`
    select job_id, published_at is not null as published, attempts, last_error from core.outbox order by id`;
}

async function effectsOf(consumer: string) {
  const [row] = await pg.sql<{ n: number; jobs: number }[]>`
    select count(*)::int as n, count(distinct job_id)::int as jobs from test_effects where consumer = ${consumer}`;
  return row;
}

/** A memory queue with the notify consumer subscribed, recording outcomes. */
function notifyQueue() {
  const queue = createMemoryQueue({ concurrency: 2 });
  closers.push(() => queue.close());
  queue.subscribe(bindConsumer(notifyConsumer, { db: pg.db, logger: silentLogger }));
  const events: DeliveryEvent[] = [];
  queue.onDelivery((event) => events.push(event));
  const outcomes = () => events.map((e) => e.result.outcome).sort();
  return { queue, outcomes };
}

describe("writing to the outbox", () => {
  test("a handler's outbox job exists once its work commits, and the harness wakes the relay for it (#9 item 3)", async () => {
    let wakes = 0;
    const bound = bindConsumer(awardConsumer(false), {
      db: pg.db,
      logger: silentLogger,
      outboxRelay: { wake: () => (wakes += 1) },
    });
    const job = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId: "c-1", points: 5 } });
    const result = await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 });
    expect(result.outcome).toBe("success");
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false, attempts: 0 })]);
    expect(wakes).toBe(1);

    // A duplicate runs nothing, writes nothing and wakes nothing.
    expect((await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 })).outcome).toBe("duplicate");
    expect(await outboxRows()).toHaveLength(1);
    expect(wakes).toBe(1);
  });

  test("a relay whose wake() throws leaves a committed job a success; the failure is logged", async () => {
    const bound = bindConsumer(awardConsumer(false), {
      db: pg.db,
      logger: silentLogger,
      outboxRelay: {
        wake() {
          throw new Error("relay wiring broken");
        },
      },
    });
    const job = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId: "c-1", points: 3 } });
    const result = await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 }).catch((e: unknown) => e);
    expect(result).toMatchObject({ outcome: "success", ack: true });
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false })]);
    expect(silentLogger.lines).toEqual([
      expect.stringMatching(/^warn outbox relay wake\(\) failed.*relay wiring broken/),
    ]);
  });

  test("a delayMs beyond 100 years is refused with InvalidConfigError at the call, and the caller's transaction goes on", async () => {
    const refused = await pg.db.transaction(async (tx) => {
      const out = outboxIn(tx);
      const error = await out.publish(NOTIFY_QUEUE, notification(1), { delayMs: 1e16 }).catch((e: unknown) => e);
      await out.publish(NOTIFY_QUEUE, notification(2)); // the transaction is still usable
      await out.publish(NOTIFY_QUEUE, notification(3), { delayMs: 100 * 365.25 * 86_400_000 }); // the longest
      return error;
    });
    expect(refused).toBeInstanceOf(InvalidConfigError);
    expect(await outboxRows()).toHaveLength(2);
  });

  test("a rolled-back handler leaves no outbox row, and its relay is not woken (#9 item 3)", async () => {
    let wakes = 0;
    const bound = bindConsumer(awardConsumer(true), {
      db: pg.db,
      logger: silentLogger,
      outboxRelay: { wake: () => (wakes += 1) },
    });
    const job = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId: "c-1", points: 5 } });
    const result = await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 });
    expect(result.outcome).toBe("retry");
    expect(await outboxRows()).toEqual([]);
    expect(await effectsOf("test.award")).toEqual({ n: 0, jobs: 0 });
    expect(wakes).toBe(0);
  });

  test("an invalid envelope is refused at enqueue with InvalidEnvelopeError and writes no row (#9 item 3)", async () => {
    const valid = notification(5);
    const invalid = [
      { ...valid, job_id: "0b7c7a3e-4f1d-4c1e-9d57-0c9f3d1a2b3c" }, // UUID v4
      { ...valid, tenant_id: "" },
      { ...valid, kind: "has spaces" },
      { job_id: valid.job_id },
    ];
    for (const envelope of invalid) {
      const thrown = await pg.db
        .transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, envelope as Envelope))
        .catch((e: unknown) => e);
      expect(thrown).toBeInstanceOf(InvalidEnvelopeError);
      expect(isSoftcrumError(thrown, "INVALID_ENVELOPE")).toBe(true);
    }
    // And inside a handler: the handler's publish throws, the work rolls back.
    const producer = defineConsumer({
      name: "test.bad-producer",
      queue: "test.award",
      kind: "points.award.v1",
      schema: z.unknown(),
      async handle(_data, { outbox }) {
        await outbox.publish(NOTIFY_QUEUE, { ...valid, job_id: "not-a-uuid" });
      },
    });
    const result = await bindConsumer(producer, { db: pg.db, logger: silentLogger }).deliver({
      body: JSON.stringify(createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: {} })),
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "retry", error: expect.stringMatching(/InvalidEnvelopeError.*job_id/) });
    expect(await outboxRows()).toEqual([]);
  });
});

/** Waits until no other session holds a lock on an outbox row (a killed relay's backend is gone). */
async function untilRowsUnlocked() {
  for (let i = 0; i < 500; i++) {
    const [row] = await pg.sql<{ locked: number }[]>`
      select (select count(*)::int from core.outbox) - (select count(*)::int from (select id from core.outbox for update skip locked) free) as locked`;
    if (row?.locked === 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("an outbox row stayed locked: the killed relay's backend never went away");
}

describe("the outbox relay", () => {
  test("publishes committed rows once, with the envelope unchanged, and the consumer applies each once (#9 item 3)", async () => {
    const sent = [notification(1), notification(2), notification(3)];
    await pg.db.transaction(async (tx) => {
      for (const envelope of sent) await outboxIn(tx).publish(NOTIFY_QUEUE, envelope);
    });
    const { queue, outcomes } = notifyQueue();
    const relay = createOutboxRelay({ db: pg.db, queue, logger: silentLogger });
    expect(await relay.run()).toEqual({ published: 3, failed: 0, parked: 0, unconfirmed: 0, batches: 1 });
    expect(await relay.run()).toEqual({ published: 0, failed: 0, parked: 0, unconfirmed: 0, batches: 1 });
    await queue.drain();
    expect(outcomes()).toEqual(["success", "success", "success"]);
    expect(await effectsOf("test.notify-partner")).toEqual({ n: 3, jobs: 3 });
    const rows = await pg.sql<{ job_id: string; published: boolean; message_id: string | null }[]>`
      select job_id, published_at is not null as published, message_id from core.outbox order by id`;
    expect(rows.map((r) => r.job_id)).toEqual(sent.map((e) => e.job_id));
    expect(rows.every((r) => r.published && r.message_id !== null)).toBe(true);
  });

  test("a relay SIGKILLed after publishing and before marking: the next relay publishes again and the fence applies it once (#9 item 3)", async () => {
    const sent = notification(7);
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, sent));

    const script = fileURLToPath(new URL("../../test/outbox-relay-process.ts", import.meta.url));
    const crashed = await runScript(script, [pg.url]);
    expect(crashed.code).toBeNull(); // killed by its signal, not exited
    expect(crashed.stdout).not.toContain("NOT KILLED");
    const line = crashed.stdout.split("\n").find((l) => l.startsWith("PUBLISHED "));
    expect(line).toBeDefined();
    const [, publishedQueue, ...body] = (line ?? "").split(" ");
    // The message went out; the row was never marked.
    expect(publishedQueue).toBe(NOTIFY_QUEUE);
    expect(JSON.parse(body.join(" "))).toEqual(sent);
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false, attempts: 0 })]);

    // The dead relay's backend holds the row's lock until the server sees its
    // socket close; the next relay skips locked rows, so wait for that first.
    await untilRowsUnlocked();

    const { queue, outcomes } = notifyQueue();
    // The copy the dead relay published is in the transport...
    await queue.publish(NOTIFY_QUEUE, JSON.parse(body.join(" ")));
    // ...and the next relay publishes the row again.
    const relay = createOutboxRelay({ db: pg.db, queue, logger: silentLogger });
    expect(await relay.run()).toMatchObject({ published: 1, failed: 0 });
    await queue.drain();
    expect(outcomes()).toEqual(["duplicate", "success"]);
    expect(await effectsOf("test.notify-partner")).toEqual({ n: 1, jobs: 1 });
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: true, attempts: 1 })]);
  });

  test("a relay whose connection dies after publishing and before COMMIT: republished, applied once (#9 item 3)", async () => {
    const sent = notification(9);
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, sent));
    const { queue, outcomes } = notifyQueue();
    let killed = false;
    const killingPort: Pick<QueuePort, "publish"> = {
      async publish(name, payload, opts): Promise<PublishReceipt> {
        const receipt = await queue.publish(name, payload, opts);
        if (!killed) {
          killed = true;
          await pg.sql`select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'outbox-relay-dies'`;
        }
        return receipt;
      },
    };
    const dying = createOutboxRelay({ db: connect("outbox-relay-dies", 1), queue: killingPort, logger: silentLogger });
    await expect(dying.run()).rejects.toThrow();
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false })]);

    const relay = createOutboxRelay({ db: pg.db, queue, logger: silentLogger });
    expect(await relay.run()).toMatchObject({ published: 1 });
    await queue.drain();
    expect(outcomes()).toEqual(["duplicate", "success"]);
    expect(await effectsOf("test.notify-partner")).toEqual({ n: 1, jobs: 1 });
  });

  test("a failed publish keeps the row with its error and a later retry time; it goes out once the transport is back (#9 item 3)", async () => {
    const sent = notification(4);
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, sent));
    const { queue, outcomes } = notifyQueue();
    let down = true;
    const flaky: Pick<QueuePort, "publish"> = {
      publish: (name, payload, opts) =>
        down ? Promise.reject(new Error("queue service unavailable")) : queue.publish(name, payload, opts),
    };
    const relay = createOutboxRelay({ db: pg.db, queue: flaky, logger: silentLogger, random: () => 0 });
    expect(await relay.run()).toMatchObject({ published: 0, failed: 1 });
    expect(await outboxRows()).toEqual([
      expect.objectContaining({ published: false, attempts: 1, last_error: "Error: queue service unavailable" }),
    ]);
    // Not due again before its backoff.
    expect(await relay.run()).toMatchObject({ published: 0, failed: 0 });
    down = false;
    await pg.sql`update core.outbox set available_at = now()`;
    expect(await relay.run()).toMatchObject({ published: 1, failed: 0 });
    await queue.drain();
    expect(outcomes()).toEqual(["success"]);
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: true, attempts: 2, last_error: null })]);
  });

  test("two relays at once publish every row exactly once, each taking its own rows (#9 item 3)", async () => {
    const total = 20;
    const sent = Array.from({ length: total }, (_, i) => notification(i + 1));
    await pg.db.transaction(async (tx) => {
      for (const envelope of sent) await outboxIn(tx).publish(NOTIFY_QUEUE, envelope);
    });
    const published = new Map<string, string[]>();
    // The first publish of each relay waits until both relays hold a batch:
    // the two transactions' row locks overlap in time.
    let waiting = 0;
    let release: () => void = () => {};
    const bothHoldABatch = new Promise<void>((resolve) => {
      release = resolve;
    });
    const port = (relayName: string): Pick<QueuePort, "publish"> => {
      let first = true;
      return {
        async publish(_queue, payload) {
          if (first) {
            first = false;
            waiting += 1;
            if (waiting === 2) release();
            await bothHoldABatch;
          }
          published.set(payload.job_id, [...(published.get(payload.job_id) ?? []), relayName]);
          return { messageId: null, stored: true };
        },
      };
    };
    const a = createOutboxRelay({
      db: connect("outbox-relay-a"),
      queue: port("a"),
      batchSize: 5,
      logger: silentLogger,
    });
    const b = createOutboxRelay({
      db: connect("outbox-relay-b"),
      queue: port("b"),
      batchSize: 5,
      logger: silentLogger,
    });
    const [ra, rb] = await Promise.all([a.run(), b.run()]);

    expect(ra.published + rb.published).toBe(total);
    expect(ra.published).toBeGreaterThan(0);
    expect(rb.published).toBeGreaterThan(0);
    expect(published.size).toBe(total);
    expect([...published.values()].every((by) => by.length === 1)).toBe(true);
    expect((await outboxRows()).every((r) => r.published && r.attempts === 1)).toBe(true);
  });

  test("wake() runs a pass in the background; run() after it sees its result; stop() waits for it (#9 item 3)", async () => {
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, notification(1)));
    const { queue, outcomes } = notifyQueue();
    const relay = createOutboxRelay({ db: pg.db, queue, logger: silentLogger });
    relay.wake();
    relay.wake(); // coalesced with the first
    // Passes never overlap: this one runs after the woken one and finds nothing left.
    expect(await relay.run()).toMatchObject({ published: 0 });
    await relay.stop();
    await queue.drain();
    expect(outcomes()).toEqual(["success"]);
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: true })]);
  });

  test("a delay and a target consumer written with the job reach the transport's publish options (#9 item 3)", async () => {
    const delayed = notification(1);
    const addressed = notification(2);
    await pg.db.transaction(async (tx) => {
      await outboxIn(tx).publish(NOTIFY_QUEUE, delayed, { delayMs: 60_000 });
      await outboxIn(tx).publish(NOTIFY_QUEUE, addressed, { targetConsumer: "test.notify-partner" });
    });
    const seen: { jobId: string; opts: unknown }[] = [];
    const recording: Pick<QueuePort, "publish"> = {
      async publish(_queue, payload, opts) {
        seen.push({ jobId: payload.job_id, opts });
        return { messageId: null, stored: true };
      },
    };
    const relay = createOutboxRelay({ db: pg.db, queue: recording, logger: silentLogger });
    expect(await relay.run()).toMatchObject({ published: 2 });
    expect(seen).toEqual([
      { jobId: delayed.job_id, opts: { delayMs: expect.any(Number) } },
      { jobId: addressed.job_id, opts: { targetConsumer: "test.notify-partner" } },
    ]);
    const delayMs = (seen[0]?.opts as { delayMs?: number } | undefined)?.delayMs ?? 0;
    // What is left of the minute, counted from the write.
    expect(delayMs).toBeGreaterThan(50_000);
    expect(delayMs).toBeLessThanOrEqual(60_000);
  });

  /** A relay started by `begin` publishes a row another process commits, nobody waking it, until stopped. */
  async function pollsWithoutWaking(begin: (relay: ReturnType<typeof createOutboxRelay>) => Promise<void>) {
    const { queue, outcomes } = notifyQueue();
    const relay = createOutboxRelay({ db: pg.db, queue, pollIntervalMs: 20, logger: silentLogger });
    await begin(relay);
    try {
      // Another process's transaction: nobody wakes this relay for it.
      await connect("outbox-other-producer", 1).transaction((tx) =>
        outboxIn(tx).publish(NOTIFY_QUEUE, notification(3)),
      );
      await vi.waitFor(async () => expect(await outboxRows()).toEqual([expect.objectContaining({ published: true })]), {
        timeout: 10_000,
        interval: 20,
      });
    } finally {
      await relay.stop();
    }
    await queue.drain();
    expect(outcomes()).toEqual(["success"]);
  }

  test("a started relay publishes rows committed elsewhere without being woken, until stopped (#9 item 3)", async () => {
    await pollsWithoutWaking(async (relay) => relay.start());
  });

  test("stop() waits for every pass, one asked for while it waited too: nothing publishes after stop() returned", async () => {
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, notification(1)));
    const gates = [latch(), latch()];
    const entered = [latch(), latch()];
    const published: string[] = [];
    let calls = 0;
    const slow: Pick<QueuePort, "publish"> = {
      async publish(_queue, payload) {
        const n = calls++;
        entered[n]?.open();
        await gates[n]?.opened;
        published.push(payload.job_id);
        return { messageId: null, stored: true };
      },
    };
    const relay = createOutboxRelay({ db: pg.db, queue: slow, logger: silentLogger });
    const first = relay.run();
    await entered[0]?.opened;
    let stopped = false;
    const stopping = relay.stop().then(() => {
      stopped = true;
    });
    // A pass asked for while stop() waits (a commit's wake, a caller's run()).
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, notification(2)));
    const second = relay.run();
    gates[0]?.open();
    await first;
    await entered[1]?.opened;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(stopped).toBe(false);
    gates[1]?.open();
    await stopping;
    expect(await second).toMatchObject({ published: 1 });
    expect(published).toHaveLength(2);
  });

  test("a relay started again after stop() polls again", async () => {
    await pollsWithoutWaking(async (relay) => {
      relay.start();
      await relay.stop();
      relay.start();
    });
  });

  test("prune deletes published rows past the retention and keeps unpublished ones (#9 item 3)", async () => {
    await pg.db.transaction(async (tx) => {
      await outboxIn(tx).publish(NOTIFY_QUEUE, notification(1));
      await outboxIn(tx).publish(NOTIFY_QUEUE, notification(2));
    });
    await pg.sql`update core.outbox set published_at = now() - interval '2 days'
                 where id = (select id from core.outbox order by id limit 1)`;
    const relay = createOutboxRelay({ db: pg.db, queue: notifyQueue().queue, logger: silentLogger });
    expect(await relay.prune()).toBe(1);
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false })]);
  });
});

/** A port that records every publish per job_id and answers stored; `failFor` rows throw `failWith()`. */
function recordingPort(opts: { delayMs?: number; failFor?: Set<string>; failWith?: () => Error } = {}) {
  const published = new Map<string, number>();
  const port: Pick<QueuePort, "publish"> = {
    async publish(_queue, payload): Promise<PublishReceipt> {
      if (opts.delayMs) await new Promise((r) => setTimeout(r, opts.delayMs));
      if (opts.failFor?.has(payload.job_id)) throw (opts.failWith ?? (() => new Error("refused")))();
      published.set(payload.job_id, (published.get(payload.job_id) ?? 0) + 1);
      return { messageId: `m-${payload.job_id}`, stored: true };
    },
  };
  return { port, published };
}

/** `runs` passes of `relay`, each as its report's counts or what it threw. */
async function passes(relay: ReturnType<typeof createOutboxRelay>, runs: number) {
  const outcomes: string[] = [];
  for (let pass = 0; pass < runs; pass++) {
    outcomes.push(
      await relay.run().then(
        (r) => `published ${r.published} failed ${r.failed} parked ${r.parked}`,
        (e: unknown) => `threw ${String(e).slice(0, 200)}`,
      ),
    );
  }
  return outcomes;
}

describe("the relay's bookkeeping holds whatever the session, the errors and the logger", () => {
  test("a batch whose publishes outlast the session's idle_in_transaction_session_timeout still marks its rows: each published once", async () => {
    const sent = Array.from({ length: 4 }, (_, i) => notification(i + 1));
    await pg.db.transaction(async (tx) => {
      for (const e of sent) await outboxIn(tx).publish(NOTIFY_QUEUE, e);
    });
    // Sessions that may idle in a transaction 300 ms at most (a role's or a
    // database's setting); the batch publishes for 4 × 150 ms without SQL.
    const db = connect("outbox-relay-idle-bound", 2, { idle_in_transaction_session_timeout: 300 });
    const { port, published } = recordingPort({ delayMs: 150 });
    const relay = createOutboxRelay({ db, queue: port, logger: silentLogger, publishTimeoutMs: 10_000 });
    expect(await passes(relay, 3)).toEqual([
      "published 4 failed 0 parked 0",
      "published 0 failed 0 parked 0",
      "published 0 failed 0 parked 0",
    ]);
    expect([...published.values()]).toEqual([1, 1, 1, 1]);
    expect((await outboxRows()).every((r) => r.published && r.attempts === 1)).toBe(true);
  });

  test("a relay frozen inside its batch is still cut off by the server, about publishTimeoutMs plus a second later", async () => {
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, notification(1)));
    // No idle bound of the session's own: the relay's is the only one.
    const db = connect("outbox-relay-frozen", 1, { idle_in_transaction_session_timeout: 0 });
    const frozen: Pick<QueuePort, "publish"> = {
      async publish() {
        const until = Date.now() + 2_500; // the event loop blocked: no timer of the relay's fires
        while (Date.now() < until) {}
        return { messageId: "m-frozen", stored: true };
      },
    };
    const relay = createOutboxRelay({ db, queue: frozen, logger: silentLogger, publishTimeoutMs: 200 });
    await expect(relay.run()).rejects.toThrow(/CONNECTION_CLOSED/); // the server ended the session
    expect(await outboxRows()).toEqual([expect.objectContaining({ published: false, attempts: 0 })]);
  });

  test("a publish error whose text holds a NUL byte is recorded without it; the batch's other rows stay marked", async () => {
    const good = notification(1);
    const bad = notification(2);
    await pg.db.transaction(async (tx) => {
      await outboxIn(tx).publish(NOTIFY_QUEUE, good);
      await outboxIn(tx).publish(NOTIFY_QUEUE, bad);
    });
    const { port, published } = recordingPort({
      failFor: new Set([bad.job_id]),
      failWith: () => new Error("upstream said \u0000\u0001 garbage"),
    });
    const relay = createOutboxRelay({ db: pg.db, queue: port, logger: silentLogger, random: () => 0 });
    expect(await passes(relay, 3)).toEqual([
      "published 1 failed 1 parked 0",
      "published 0 failed 0 parked 0",
      "published 0 failed 0 parked 0",
    ]);
    expect(published.get(good.job_id)).toBe(1);
    const after = await outboxRows();
    expect(after.find((r) => r.job_id === good.job_id)).toMatchObject({ published: true });
    expect(after.find((r) => r.job_id === bad.job_id)).toMatchObject({
      published: false,
      attempts: 1,
      last_error: "Error: upstream said \u0001 garbage",
    });
  });

  test("a logger that throws changes nothing: the stored row is marked once, the failed one recorded", async () => {
    const good = notification(1);
    const bad = notification(2);
    await pg.db.transaction(async (tx) => {
      await outboxIn(tx).publish(NOTIFY_QUEUE, good);
      await outboxIn(tx).publish(NOTIFY_QUEUE, bad);
    });
    const { port, published } = recordingPort({ failFor: new Set([bad.job_id]) });
    const throwing: Logger = {
      warn() {
        throw new Error("log sink down");
      },
      error() {
        throw new Error("log sink down");
      },
    };
    const relay = createOutboxRelay({ db: pg.db, queue: port, logger: throwing, random: () => 0 });
    expect(await passes(relay, 3)).toEqual([
      "published 1 failed 1 parked 0",
      "published 0 failed 0 parked 0",
      "published 0 failed 0 parked 0",
    ]);
    expect(published.get(good.job_id)).toBe(1);
    expect(await outboxRows()).toEqual([
      expect.objectContaining({ job_id: good.job_id, published: true }),
      expect.objectContaining({ job_id: bad.job_id, published: false, attempts: 1 }),
    ]);
  });

  test("a row the port refuses for good (InvalidConfigError) is parked with its error and an error log, never published again; the runbook's release sends it", async () => {
    const refused = notification(1);
    const fine = notification(2);
    await pg.db.transaction(async (tx) => {
      await outboxIn(tx).publish(NOTIFY_QUEUE, refused);
      await outboxIn(tx).publish(NOTIFY_QUEUE, fine);
    });
    let tries = 0;
    let refusing = true;
    const { queue, outcomes } = notifyQueue();
    const port: Pick<QueuePort, "publish"> = {
      publish(name, payload, opts) {
        if (payload.job_id !== refused.job_id) return queue.publish(name, payload, opts);
        tries += 1;
        return refusing
          ? Promise.reject(new InvalidConfigError("publish: this transport cannot carry it"))
          : queue.publish(name, payload, opts);
      },
    };
    const relay = createOutboxRelay({ db: pg.db, queue: port, logger: silentLogger, random: () => 0 });
    expect(await passes(relay, 2)).toEqual(["published 1 failed 0 parked 1", "published 0 failed 0 parked 0"]);
    expect(tries).toBe(1);
    const [parked] = await pg.sql<{ attempts: number; last_error: string; parked: boolean }[]>`
      select attempts, last_error, available_at = 'infinity' as parked from core.outbox where job_id = ${refused.job_id}`;
    expect(parked).toEqual({
      attempts: 1,
      parked: true,
      last_error: expect.stringMatching(/^parked, .*InvalidConfigError.*cannot carry it/),
    });
    expect(silentLogger.lines).toEqual([
      expect.stringMatching(/^error outbox relay: row .* parked: .*cannot carry it/),
    ]);

    // Fixed, and released as runbooks/outbox.md says.
    refusing = false;
    await pg.sql`update core.outbox set available_at = now() where published_at is null and available_at = 'infinity'`;
    expect(await relay.run()).toMatchObject({ published: 1, parked: 0 });
    await queue.drain();
    expect(outcomes()).toEqual(["success", "success"]);
  });

  test("a row inserted by hand whose payload is not JSON is parked, not tried again forever", async () => {
    const id = uuidv7();
    await pg.sql`insert into core.outbox (id, queue, payload, job_id, kind)
      values (${id}, ${NOTIFY_QUEUE}, '{"job_id": "cut off', ${uuidv7()}, 'partner.notify.v1')`;
    const { queue } = notifyQueue();
    const relay = createOutboxRelay({ db: pg.db, queue, logger: silentLogger, random: () => 0 });
    expect(await passes(relay, 2)).toEqual(["published 0 failed 0 parked 1", "published 0 failed 0 parked 0"]);
    const [row] = await pg.sql<{ parked: boolean; last_error: string }[]>`
      select available_at = 'infinity' as parked, last_error from core.outbox where id = ${id}`;
    expect(row).toEqual({ parked: true, last_error: expect.stringMatching(/^parked, .*payload is not JSON/) });
  });
});

describe("the relay's options", () => {
  test("publishTimeoutMs and pollIntervalMs beyond a timer's 2^31 − 1 ms are refused with InvalidConfigError; the longest one works", async () => {
    const { port } = recordingPort();
    for (const option of ["publishTimeoutMs", "pollIntervalMs"] as const) {
      expect(() => createOutboxRelay({ db: pg.db, queue: port, logger: silentLogger, [option]: 2 ** 31 })).toThrow(
        InvalidConfigError,
      );
    }
    await pg.db.transaction((tx) => outboxIn(tx).publish(NOTIFY_QUEUE, notification(1)));
    // Its server-side idle bound is capped at the setting's own maximum.
    const longest = createOutboxRelay({ db: pg.db, queue: port, logger: silentLogger, publishTimeoutMs: 2 ** 31 - 1 });
    expect(await longest.run()).toMatchObject({ published: 1, failed: 0 });
  });

  test("a keepPublishedMs beyond 100 years is refused with InvalidConfigError; the longest one prunes without failing", async () => {
    const { port } = recordingPort();
    expect(() => createOutboxRelay({ db: pg.db, queue: port, logger: silentLogger, keepPublishedMs: 1e15 })).toThrow(
      /keepPublishedMs must be at most/,
    );
    const relay = createOutboxRelay({
      db: pg.db,
      queue: port,
      logger: silentLogger,
      keepPublishedMs: 100 * 365.25 * 86_400_000,
    });
    await expect(relay.prune()).resolves.toBe(0);
  });
});
