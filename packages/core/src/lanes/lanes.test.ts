// Lanes (#20 item 2, ADR 0011): a marketing consumer yields to its channel's
// transactional backlog — a deferral that spends no attempt, takes no token,
// no connection and no fence — and resumes when the backlog falls; a
// transactional consumer's final outcomes take its jobs out of the backlog;
// publishers count transactional jobs in. On real Postgres, through the
// in-process adapter.
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { createMemoryQueue, type DeliveryEvent } from "../adapters/memory/index.ts";
import { createManualClock } from "../clock.ts";
import { bindConsumer, defineConsumer, type HarnessDeps } from "../consumer.ts";
import { deadLetters, processedJobs } from "../db/schema.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { InvalidConfigError, InvalidEnvelopeError, PermanentError } from "../errors.ts";
import { inProcessRateLimiter, provider } from "../limits/index.ts";
import type { QueuePort } from "../queue-port.ts";
import { inProcessLaneBacklog, type LaneBacklog } from "./backlog.ts";
import { laneQueue } from "./names.ts";
import { countTransactional } from "./publish.ts";

const pg = useEffectsDatabase("lanes");
const schema = z.object({ n: z.number().int() });
const TRANSACTIONAL = laneQueue("email", "transactional");
const MARKETING = laneQueue("email", "marketing");
let seq = 0;

function laneConsumer(
  queue: string,
  log: string[],
  options: { yieldAbove?: number; fail?: (n: number) => Error | undefined } = {},
) {
  seq += 1;
  const name = `lanes.${queue.split(".")[2]}-${seq}`;
  return defineConsumer({
    name,
    queue,
    kind: "email.send.v1",
    schema,
    ...(options.yieldAbove !== undefined ? { yieldAbove: options.yieldAbove } : {}),
    handle: async (data, { tx, envelope }) => {
      const failure = options.fail?.(data.n);
      if (failure) throw failure;
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: data.n });
      log.push(`${queue.split(".")[2]}:${data.n}`);
    },
  });
}
const job = (n: number): Envelope => createEnvelope({ tenantId: "t", kind: "email.send.v1", data: { n } });
const deps = (backlog: LaneBacklog, extra: Partial<HarnessDeps> = {}): HarnessDeps => ({
  db: pg.db,
  logger: silentLogger,
  laneBacklog: backlog,
  ...extra,
});

describe("a marketing consumer yields to its channel's transactional backlog", () => {
  test("no marketing job runs while a transactional one is outstanding; every job of both runs once, no attempt spent, no letter", async () => {
    const clock = createManualClock();
    const backlog = inProcessLaneBacklog({ refreshMs: 0, now: clock.now });
    const queue = createMemoryQueue({ clock, concurrency: 2 });
    const publisher = countTransactional(queue, backlog, { now: clock.now });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    const log: string[] = [];
    const transactional = laneConsumer(TRANSACTIONAL, log);
    const marketing = laneConsumer(MARKETING, log);
    queue.subscribe(bindConsumer(transactional, deps(backlog, { now: clock.now })));
    queue.subscribe(bindConsumer(marketing, deps(backlog, { now: clock.now })));

    for (let n = 0; n < 20; n++) await publisher.publish(TRANSACTIONAL, job(n));
    for (let n = 100; n < 110; n++) await publisher.publish(MARKETING, job(n));
    expect(await backlog.size("email")).toBe(20);
    await queue.drain();

    // Every transactional job ran before the first marketing one.
    const firstMarketing = log.findIndex((line) => line.startsWith("marketing"));
    expect(log.slice(0, firstMarketing).every((line) => line.startsWith("transactional"))).toBe(true);
    expect(log.slice(firstMarketing).every((line) => line.startsWith("marketing"))).toBe(true);
    expect(log.filter((line) => line.startsWith("transactional"))).toHaveLength(20);
    expect(log.filter((line) => line.startsWith("marketing"))).toHaveLength(10);
    const marketingEvents = events.filter((e) => e.consumer === marketing.name);
    expect(marketingEvents.some((e) => e.result.outcome === "yielded")).toBe(true);
    // Yields are not attempts: every marketing delivery is attempt 1.
    expect(marketingEvents.every((e) => e.deliveryCount === 1)).toBe(true);
    expect(await backlog.size("email")).toBe(0);
    expect(await pg.db.select().from(deadLetters)).toHaveLength(0);
    expect(await pg.db.select().from(processedJobs)).toHaveLength(30);
    await queue.close();
  });

  test("a yield takes no rate-limit token, no connection and no fence", async () => {
    const backlog = inProcessLaneBacklog({ refreshMs: 0 });
    const limiter = inProcessRateLimiter();
    let takes = 0;
    const counting = {
      ...limiter,
      take: (b: Parameters<typeof limiter.take>[0]) => {
        takes += 1;
        return limiter.take(b);
      },
    };
    const consumer = defineConsumer({
      name: `lanes.tokens-${++seq}`,
      queue: MARKETING,
      kind: "email.send.v1",
      schema,
      limits: [provider("resend", { rate: 10, per: "1s" })],
      timeoutMs: 1_000,
      handle: async () => {},
    });
    // A pool that is closed: a delivery that asked it for a connection would be `deferred`.
    const client = postgres(pg.url, { max: 1, onnotice: () => {} });
    await client.end();
    const bound = bindConsumer(consumer, { ...deps(backlog, { rateLimiter: counting }), db: drizzle({ client }) });
    const blocker = job(1);
    await backlog.add("email", [{ jobId: blocker.job_id, dueAt: Date.now() - 1 }]);
    const result = await bound.deliver({ body: JSON.stringify(job(7)), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "yielded", ack: false, spendsAttempt: false });
    expect(takes).toBe(0);
    expect(await pg.db.select().from(processedJobs)).toHaveLength(0);
    // Once the backlog is gone the same delivery takes its token and asks the closed pool (deferred).
    await backlog.remove("email", blocker.job_id);
    expect(await bound.deliver({ body: JSON.stringify(job(7)), deliveryCount: 1 })).toMatchObject({
      outcome: "deferred",
    });
    expect(takes).toBe(1);
  });

  test("yieldAbove lets a marketing consumer run beside a small transactional backlog", async () => {
    const backlog = inProcessLaneBacklog({ refreshMs: 0 });
    const log: string[] = [];
    const bound = bindConsumer(laneConsumer(MARKETING, log, { yieldAbove: 2 }), deps(backlog));
    const at = Date.now() - 1;
    await backlog.add(
      "email",
      [job(1), job(2)].map((e) => ({ jobId: e.job_id, dueAt: at })),
    );
    expect((await bound.deliver({ body: JSON.stringify(job(10)), deliveryCount: 1 })).outcome).toBe("success");
    await backlog.add("email", [{ jobId: job(3).job_id, dueAt: at }]);
    expect((await bound.deliver({ body: JSON.stringify(job(11)), deliveryCount: 1 })).outcome).toBe("yielded");
    // Another channel's backlog is not this consumer's.
    const sms = inProcessLaneBacklog({ refreshMs: 0 });
    await sms.add("sms", [{ jobId: job(4).job_id, dueAt: at }]);
    const other = bindConsumer(laneConsumer(MARKETING, log), deps(sms));
    expect((await other.deliver({ body: JSON.stringify(job(12)), deliveryCount: 1 })).outcome).toBe("success");
  });

  test("a backlog that cannot be read defers the marketing delivery (never read as empty), and it runs once the store answers", async () => {
    const inner = inProcessLaneBacklog({ refreshMs: 0 });
    let down = true;
    const flaky: LaneBacklog = {
      ...inner,
      size: async (channel) => {
        if (down) throw new Error("ECONNREFUSED 127.0.0.1:6379");
        return inner.size(channel);
      },
    };
    const log: string[] = [];
    const bound = bindConsumer(laneConsumer(MARKETING, log), deps(flaky));
    const body = JSON.stringify(job(5));
    const first = await bound.deliver({ body, deliveryCount: 1 });
    expect(first).toMatchObject({ outcome: "deferred", ack: false, spendsAttempt: false });
    if (first.outcome === "deferred") expect(first.error).toMatch(/lane backlog unavailable.*ECONNREFUSED/);
    expect(log).toEqual([]);
    down = false;
    expect((await bound.deliver({ body, deliveryCount: 1, deferrals: 1 })).outcome).toBe("success");
    expect(log).toEqual(["marketing:5"]);
  });

  test("a marketing job that yields for longer than its attempt budget is never dead-lettered and runs once the backlog is gone", async () => {
    const clock = createManualClock();
    const backlog = inProcessLaneBacklog({ refreshMs: 0, now: clock.now });
    const queue = createMemoryQueue({ clock });
    const log: string[] = [];
    const marketing = laneConsumer(MARKETING, log);
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    queue.subscribe(bindConsumer(marketing, deps(backlog, { now: clock.now })));
    const blocker = job(1);
    await backlog.add("email", [{ jobId: blocker.job_id, dueAt: clock.now() }]);
    await queue.publish(MARKETING, job(50));
    // 30 yields (the budget is 5 attempts), then the transactional job settles.
    while (events.length < 30) await clock.advance(1_000);
    expect(events.every((e) => e.result.outcome === "yielded" && e.deliveryCount === 1)).toBe(true);
    await backlog.remove("email", blocker.job_id);
    await queue.drain();
    expect(log).toEqual(["marketing:50"]);
    expect(events.at(-1)?.result.outcome).toBe("success");
    expect(await pg.db.select().from(deadLetters)).toHaveLength(0);
    await queue.close();
  });
});

describe("a transactional consumer's final outcomes take jobs out of the backlog", () => {
  test("success, duplicate, a permanent failure's letter and poison leave; a retry stays", async () => {
    const backlog = inProcessLaneBacklog({ refreshMs: 0 });
    const log: string[] = [];
    const consumer = laneConsumer(TRANSACTIONAL, log, {
      fail: (n) => (n === 2 ? new PermanentError("bad address") : n === 3 ? new Error("ETIMEDOUT") : undefined),
    });
    const bound = bindConsumer(consumer, deps(backlog));
    const jobs = [job(1), job(2), job(3)];
    const poisonId = job(4).job_id;
    const at = Date.now() - 1;
    await backlog.add(
      "email",
      [...jobs, { job_id: poisonId }].map((e) => ({ jobId: e.job_id, dueAt: at })),
    );
    expect(await backlog.size("email")).toBe(4);

    expect((await bound.deliver({ body: JSON.stringify(jobs[0]), deliveryCount: 1 })).outcome).toBe("success");
    expect(await backlog.size("email")).toBe(3);
    // Counted again by a second publish of the same job: still one entry, and its duplicate delivery settles it.
    await backlog.add("email", [{ jobId: (jobs[0] as Envelope).job_id, dueAt: at }]);
    expect((await bound.deliver({ body: JSON.stringify(jobs[0]), deliveryCount: 1 })).outcome).toBe("duplicate");
    expect(await backlog.size("email")).toBe(3);
    expect((await bound.deliver({ body: JSON.stringify(jobs[1]), deliveryCount: 1 })).outcome).toBe("dead_lettered");
    expect(await backlog.size("email")).toBe(2);
    expect((await bound.deliver({ body: JSON.stringify(jobs[2]), deliveryCount: 1 })).outcome).toBe("retry");
    expect(await backlog.size("email")).toBe(2);
    const poison = JSON.stringify({ ...job(4), job_id: poisonId, data: { n: "not a number" } });
    expect((await bound.deliver({ body: poison, deliveryCount: 1 })).outcome).toBe("poison");
    expect(await backlog.size("email")).toBe(1);
    // The retried job's last attempt dead-letters it: out.
    expect((await bound.deliver({ body: JSON.stringify(jobs[2]), deliveryCount: 5 })).outcome).toBe("dead_lettered");
    expect(await backlog.size("email")).toBe(0);
  });

  test("a removal that fails never changes the outcome: the job committed, the entry goes stale instead", async () => {
    let now = Date.now();
    const inner = inProcessLaneBacklog({ refreshMs: 0, staleAfterMs: 60_000, now: () => now });
    const broken: LaneBacklog = { ...inner, remove: async () => Promise.reject(new Error("READONLY")) };
    const log: string[] = [];
    const bound = bindConsumer(laneConsumer(TRANSACTIONAL, log), deps(broken));
    const e = job(9);
    await inner.add("email", [{ jobId: e.job_id, dueAt: now }]);
    expect((await bound.deliver({ body: JSON.stringify(e), deliveryCount: 1 })).outcome).toBe("success");
    expect(log).toEqual(["transactional:9"]);
    expect(await inner.size("email")).toBe(1);
    now += 60_001;
    expect(await inner.size("email")).toBe(0);
  });
});

describe("countTransactional", () => {
  test("counts transactional publishes once per job, from when they are due; not marketing, not other queues, not invalid envelopes", async () => {
    let now = 1_000_000;
    const backlog = inProcessLaneBacklog({ refreshMs: 0, now: () => now });
    const sent: string[] = [];
    const port: QueuePort = {
      publish: async (queue) => {
        sent.push(queue);
        return { messageId: null, stored: true };
      },
      schedule: async (queue) => {
        sent.push(queue);
        return { messageId: null, stored: true };
      },
    };
    const publisher = countTransactional(port, backlog, { now: () => now });
    const e = job(1);
    await publisher.publish(TRANSACTIONAL, e);
    await publisher.publish(TRANSACTIONAL, e);
    await publisher.publish(MARKETING, job(2));
    await publisher.publish("loyalty.points", job(3));
    await publisher.publish(TRANSACTIONAL, job(4), { delayMs: 5_000 });
    await publisher.schedule(TRANSACTIONAL, job(5), new Date(now + 10_000));
    expect(sent).toHaveLength(6);
    expect(await backlog.size("email")).toBe(1);
    now += 5_000;
    expect(await backlog.size("email")).toBe(2);
    now += 5_000;
    expect(await backlog.size("email")).toBe(3);

    const strict: QueuePort = {
      publish: async () => Promise.reject(new InvalidEnvelopeError(["job_id: must be a UUID v7"])),
      schedule: async () => Promise.reject(new InvalidEnvelopeError(["job_id: must be a UUID v7"])),
    };
    const refusing = countTransactional(strict, backlog, { now: () => now });
    await expect(refusing.publish(TRANSACTIONAL, { ...job(6), job_id: "nope" })).rejects.toBeInstanceOf(
      InvalidEnvelopeError,
    );
    expect(await backlog.size("email")).toBe(3);
  });

  test("a backlog that cannot be written does not hold the notification back: it is published, and the failure logged", async () => {
    const lines: string[] = [];
    const broken: LaneBacklog = { ...inProcessLaneBacklog(), add: async () => Promise.reject(new Error("timeout")) };
    const sent: string[] = [];
    const port: QueuePort = {
      publish: async (queue) => {
        sent.push(queue);
        return { messageId: "m", stored: true };
      },
      schedule: async (queue) => {
        sent.push(queue);
        return { messageId: "m", stored: true };
      },
    };
    const publisher = countTransactional(port, broken, {
      logger: { warn: (line) => lines.push(line), error: (line) => lines.push(line) },
    });
    expect(await publisher.publish(TRANSACTIONAL, job(1))).toEqual({ messageId: "m", stored: true });
    expect(sent).toEqual([TRANSACTIONAL]);
    expect(lines.join("\n")).toMatch(/without being counted in its transactional backlog: .*timeout/);
  });
});

describe("configuration", () => {
  test("a lane consumer without a laneBacklog, and yieldAbove off a marketing lane or not a count, are refused at start", () => {
    const log: string[] = [];
    expect(() => bindConsumer(laneConsumer(MARKETING, log), { db: pg.db })).toThrow(InvalidConfigError);
    expect(() => bindConsumer(laneConsumer(TRANSACTIONAL, log), { db: pg.db })).toThrow(/needs a laneBacklog/);
    expect(() => laneConsumer(TRANSACTIONAL, log, { yieldAbove: 1 })).toThrow(
      /yieldAbove is for consumers of a marketing lane/,
    );
    expect(() => laneConsumer(MARKETING, log, { yieldAbove: -1 })).toThrow(/whole number/);
    expect(() => laneConsumer(MARKETING, log, { yieldAbove: 0.5 })).toThrow(/whole number/);
    expect(() => inProcessLaneBacklog({ staleAfterMs: 10 })).toThrow(InvalidConfigError);
    expect(() => inProcessLaneBacklog({ refreshMs: -1 })).toThrow(InvalidConfigError);
  });
});
