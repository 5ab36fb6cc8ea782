import { sql as dsql, eq } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv4 } from "uuidv7";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import {
  effects,
  recordingAlerts,
  recordingMetrics,
  silentLogger,
  tableCounts,
  useEffectsDatabase,
} from "../test/fixtures.ts";
import { createMemoryQueue, type DeliveryEvent } from "./adapters/memory/index.ts";
import { createManualClock } from "./clock.ts";
import { bindConsumer, type ConsumerDefinition, defineConsumer, type HarnessDeps } from "./consumer.ts";
import { deadLetters, processedJobs } from "./db/schema.ts";
import { createEnvelope } from "./envelope.ts";
import { InvalidConfigError, PermanentError, RateLimitedError } from "./errors.ts";

const pg = useEffectsDatabase("consumer");

const awardSchema = z.object({ customerId: z.string().min(1), points: z.number().int().positive() });

let consumerSeq = 0;
/** A consumer that credits `points` as one effect row; each test gets its own name and queue. */
function pointsConsumer(overrides: Partial<ConsumerDefinition<typeof awardSchema>> = {}) {
  consumerSeq += 1;
  return defineConsumer({
    name: `test.award-${consumerSeq}`,
    queue: `test.points-${consumerSeq}`,
    kind: "points.award.v1",
    schema: awardSchema,
    async handle(data, { tx, envelope }) {
      await tx
        .insert(effects)
        .values({ jobId: envelope.job_id, consumer: `test.award-${consumerSeq}`, amount: data.points });
    },
    ...overrides,
  });
}

function award(points = 10, tenantId = "tenant-a") {
  return createEnvelope({ tenantId, kind: "points.award.v1", data: { customerId: "c-1", points } });
}

function deps(extra: Partial<HarnessDeps> = {}): HarnessDeps {
  return { db: pg.db, logger: silentLogger, ...extra };
}

const effectCount = async () => (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`)[0]?.n;
const fenceCount = async () =>
  (await pg.sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`)[0]?.n;
const deadLetterRows = () => pg.db.select().from(deadLetters);

describe("fence and work in one transaction", () => {
  test("the same job_id delivered 8 times in parallel on separate connections produces exactly one effect", async () => {
    // Each delivery gets its own pool, so the 8 transactions are truly concurrent
    // in Postgres; the handler holds its transaction open long enough for all of
    // them to reach the fence insert while the first is still uncommitted.
    let started = 0;
    const consumer = pointsConsumer({
      async handle(data, { tx, envelope }) {
        started += 1;
        await tx.execute(dsql`select pg_sleep(0.2)`);
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "parallel", amount: data.points });
      },
    });
    const metrics = recordingMetrics();
    const body = JSON.stringify(award(25));
    const bound = Array.from({ length: 8 }, () =>
      bindConsumer(consumer, deps({ db: pg.connect({ max: 1 }).db, metrics: metrics.port })),
    );
    const results = await Promise.all(bound.map((b) => b.deliver({ body, deliveryCount: 1 })));

    expect(results.filter((r) => r.outcome === "success")).toHaveLength(1);
    expect(results.filter((r) => r.outcome === "duplicate")).toHaveLength(7);
    expect(results.every((r) => r.ack)).toBe(true);
    expect(started).toBe(1);
    expect(await effectCount()).toBe(1);
    expect(await fenceCount()).toBe(1);
    expect(metrics.count("duplicate")).toBe(7);
  });

  test("a handler that fails after writing leaves neither its effect nor the fence", async () => {
    const consumer = pointsConsumer({
      async handle(data, { tx, envelope }) {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "x", amount: data.points });
        throw new Error("downstream timeout");
      },
    });
    const result = await bindConsumer(consumer, deps()).deliver({ body: JSON.stringify(award()), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "retry", ack: false, spendsAttempt: true });
    expect(await effectCount()).toBe(0);
    expect(await fenceCount()).toBe(0);
  });

  test("the handler receives the validated data, the envelope, the attempt and a stable idempotency key", async () => {
    const seen: { data: unknown; envelope: unknown; attempt: number; key: string }[] = [];
    const consumer = pointsConsumer({
      async handle(data, ctx) {
        seen.push({ data, envelope: ctx.envelope, attempt: ctx.attempt, key: ctx.idempotencyKey });
        if (seen.length === 1) throw new Error("first attempt fails");
      },
    });
    const envelope = award(7);
    const bound = bindConsumer(consumer, deps());
    await bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });
    await bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 2 });
    let otherKey = "";
    const other = pointsConsumer({
      async handle(_data, ctx) {
        otherKey = ctx.idempotencyKey;
      },
    });
    await bindConsumer(other, deps()).deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });

    const [first, second] = seen;
    expect(first?.data).toEqual({ customerId: "c-1", points: 7 });
    expect(first?.envelope).toEqual(envelope);
    expect([first?.attempt, second?.attempt]).toEqual([1, 2]);
    expect(first?.key).toMatch(/^[0-9a-f]{64}$/);
    expect(second?.key).toBe(first?.key); // stable across deliveries of the job to this consumer
    expect(otherKey).not.toBe(first?.key); // per (job, consumer), not per job
  });
});

describe("duplicates", () => {
  test("a redelivered job is acknowledged silently with a duplicate metric and runs nothing", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      async handle(data, { tx, envelope }) {
        runs += 1;
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "dup", amount: data.points });
      },
    });
    const metrics = recordingMetrics();
    const bound = bindConsumer(consumer, deps({ metrics: metrics.port }));
    const body = JSON.stringify(award());
    expect(await bound.deliver({ body, deliveryCount: 1 })).toEqual({ outcome: "success", ack: true });
    expect(await bound.deliver({ body, deliveryCount: 2 })).toEqual({ outcome: "duplicate", ack: true });
    expect(runs).toBe(1);
    expect(await effectCount()).toBe(1);
    expect(metrics.count("duplicate")).toBe(1);
    expect(metrics.count("success")).toBe(1);
    expect(await deadLetterRows()).toHaveLength(0);
  });
});

describe("successes are metrics, not rows", () => {
  test("a successful job writes no row anywhere beyond its fence row (and the handler's own effect)", async () => {
    const before = await tableCounts(pg.sql);
    const result = await bindConsumer(pointsConsumer(), deps()).deliver({
      body: JSON.stringify(award()),
      deliveryCount: 1,
    });
    expect(result.outcome).toBe("success");
    const after = await tableCounts(pg.sql);
    const grown = Object.entries(after)
      .filter(([table, n]) => n !== before[table])
      .map(([table, n]) => [table, n - (before[table] ?? 0)]);
    expect(Object.fromEntries(grown)).toEqual({ "core.processed_jobs": 1, "public.test_effects": 1 });
  });
});

describe("transient failures", () => {
  test("a transient failure runs the handler 5 times with growing intervals, then writes one dead letter", async () => {
    const clock = createManualClock(Date.parse("2026-01-01T00:00:00Z"));
    const queue = createMemoryQueue({ clock });
    const runsAt: number[] = [];
    const consumer = pointsConsumer({
      async handle() {
        runsAt.push(clock.now());
        throw new Error(`provider timeout #${runsAt.length}`);
      },
    });
    const alerts = recordingAlerts();
    queue.subscribe(bindConsumer(consumer, deps({ alerts: alerts.port, now: clock.now })));
    const envelope = award(5);
    await queue.publish(consumer.queue, envelope);
    await queue.drain();

    expect(runsAt).toHaveLength(5);
    const intervals = runsAt.slice(1).map((t, i) => t - (runsAt[i] as number));
    for (let i = 1; i < intervals.length; i++) expect(intervals[i]).toBeGreaterThan(intervals[i - 1] as number);
    // Equal jitter around base 30 s: retry n waits in [e/2, e), e = 30 s · 2^(n-1).
    intervals.forEach((ms, i) => {
      const ceiling = 30_000 * 2 ** i;
      expect(ms).toBeGreaterThanOrEqual(ceiling / 2);
      expect(ms).toBeLessThan(ceiling);
    });

    const rows = await deadLetterRows();
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      jobId: envelope.job_id,
      queue: consumer.queue,
      consumer: consumer.name,
      attempts: 5,
      errorClass: "exhausted",
      status: "pending_review",
      lastError: "Error: provider timeout #5",
      correlationId: envelope.correlation_id,
      tenantId: "tenant-a",
      kind: "points.award.v1",
    });
    expect(JSON.parse(rows[0]?.payload ?? "")).toEqual(envelope);
    expect(alerts.sent).toHaveLength(1);
    expect(queue.pending()).toBe(0);
    expect(await effectCount()).toBe(0);
    await queue.close();
  });

  test("a job that fails twice and then succeeds is applied once, with no dead letter", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      async handle(data, { tx, envelope }) {
        runs += 1;
        if (runs < 3) throw new Error("flaky");
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "flaky", amount: data.points });
      },
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now })));
    await queue.publish(consumer.queue, award());
    await queue.drain();
    expect(runs).toBe(3);
    expect(await effectCount()).toBe(1);
    expect(await deadLetterRows()).toHaveLength(0);
    await queue.close();
  });

  test("a per-consumer retry policy is honoured", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      retry: { maxAttempts: 2, baseDelayMs: 1000, maxDelayMs: 1000 },
      async handle() {
        runs += 1;
        throw new Error("nope");
      },
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now })));
    await queue.publish(consumer.queue, award());
    await queue.drain();
    expect(runs).toBe(2);
    expect((await deadLetterRows())[0]).toMatchObject({ attempts: 2, errorClass: "exhausted" });
    await queue.close();
  });
});

describe("hard failures", () => {
  test("a PermanentError dead-letters at once, without spending the retry budget", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      async handle() {
        runs += 1;
        throw new PermanentError("customer c-1 is closed");
      },
    });
    const result = await bindConsumer(consumer, deps()).deliver({ body: JSON.stringify(award()), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "dead_lettered", ack: true, errorClass: "permanent" });
    expect(runs).toBe(1);
    expect((await deadLetterRows())[0]).toMatchObject({
      attempts: 1,
      errorClass: "permanent",
      lastError: "PermanentError: customer c-1 is closed",
    });
  });

  test("a delivery whose count is past the budget is dead-lettered without running the handler", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      async handle() {
        runs += 1;
      },
    });
    const result = await bindConsumer(consumer, deps()).deliver({ body: JSON.stringify(award()), deliveryCount: 6 });
    expect(result).toMatchObject({ outcome: "dead_lettered", ack: true, errorClass: "exhausted" });
    expect(runs).toBe(0);
    const [row] = await deadLetterRows();
    expect(row?.attempts).toBe(5);
    expect(row?.lastError).toContain("delivery 6 is past the budget of 5 attempts");
  });

  test("a delivery past the budget of a job that did commit is a duplicate, not a dead letter", async () => {
    const bound = bindConsumer(pointsConsumer(), deps());
    const body = JSON.stringify(award());
    await bound.deliver({ body, deliveryCount: 1 });
    expect(await bound.deliver({ body, deliveryCount: 9 })).toEqual({ outcome: "duplicate", ack: true });
    expect(await deadLetterRows()).toHaveLength(0);
  });

  test("a job older than the consumer's maxAgeMs is dead-lettered as expired, not run", async () => {
    let runs = 0;
    const consumer = pointsConsumer({
      maxAgeMs: 60_000,
      async handle() {
        runs += 1;
      },
    });
    const envelope = award();
    const bound = bindConsumer(consumer, deps({ now: () => Date.now() + 61_000 }));
    const result = await bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "dead_lettered", errorClass: "expired" });
    expect(runs).toBe(0);
    expect((await deadLetterRows())[0]?.lastError).toMatch(/past .* maximum age of 60000 ms/);
  });
});

describe("poison messages", () => {
  const cases: [string, string | Uint8Array, RegExp][] = [
    [
      "schema-invalid data",
      JSON.stringify(createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: -3 } })),
      /invalid data for points\.award\.v1: points: /,
    ],
    ["a non-JSON body", "{not json", /payload is not JSON/],
    [
      "a job_id that is not UUID v7",
      JSON.stringify({ ...award(), job_id: uuidv4() }),
      /job_id: must be a UUID version 7/,
    ],
    [
      "a kind the consumer does not accept",
      JSON.stringify(createEnvelope({ tenantId: "t", kind: "points.award.v9", data: {} })),
      /kind "points\.award\.v9" is not accepted/,
    ],
    ["bytes that are not UTF-8", new Uint8Array([0xff, 0xfe, 0x00, 0x41]), /payload is not UTF-8/],
  ];

  test.each(cases)(
    "%s goes straight to dead letters with zero retries and the handler never runs",
    async (_name, body, error) => {
      let runs = 0;
      const consumer = pointsConsumer({
        async handle() {
          runs += 1;
        },
      });
      const metrics = recordingMetrics();
      const alerts = recordingAlerts();
      const clock = createManualClock();
      const queue = createMemoryQueue({ clock });
      const deliveries: DeliveryEvent[] = [];
      queue.onDelivery((e) => deliveries.push(e));
      queue.subscribe(bindConsumer(consumer, deps({ metrics: metrics.port, alerts: alerts.port, now: clock.now })));
      await queue.publishRaw(consumer.queue, body);
      await queue.drain();

      expect(runs).toBe(0);
      expect(deliveries).toHaveLength(1);
      expect(deliveries[0]?.result).toMatchObject({ outcome: "poison", ack: true, errorClass: "poison" });
      const rows = await deadLetterRows();
      expect(rows).toHaveLength(1);
      expect(rows[0]).toMatchObject({ attempts: 0, errorClass: "poison", status: "pending_review" });
      expect(rows[0]?.lastError).toMatch(error);
      // The payload is kept exactly as received.
      const stored =
        rows[0]?.payloadEncoding === "base64"
          ? new Uint8Array(Buffer.from(rows[0].payload, "base64"))
          : rows[0]?.payload;
      expect(stored).toEqual(body);
      expect(metrics.count("poison")).toBe(1);
      expect(alerts.sent.map((a) => a.errorClass)).toEqual(["poison"]);
      await queue.close();
    },
  );

  test("a poison payload keeps the envelope fields it could read, for the operator", async () => {
    const envelope = createEnvelope({ tenantId: "tenant-z", kind: "points.award.v1", data: { points: "ten" } });
    await bindConsumer(pointsConsumer(), deps()).deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });
    expect((await deadLetterRows())[0]).toMatchObject({
      jobId: envelope.job_id,
      tenantId: "tenant-z",
      correlationId: envelope.correlation_id,
      kind: "points.award.v1",
    });
  });

  test("the same poison job delivered again updates its pending dead letter instead of adding one", async () => {
    const alerts = recordingAlerts();
    const bound = bindConsumer(pointsConsumer(), deps({ alerts: alerts.port }));
    const body = JSON.stringify(createEnvelope({ tenantId: "t", kind: "points.award.v1", data: {} }));
    const first = await bound.deliver({ body, deliveryCount: 1 });
    const second = await bound.deliver({ body, deliveryCount: 2 });
    const rows = await deadLetterRows();
    expect(rows).toHaveLength(1);
    expect(rows[0]?.occurrences).toBe(2);
    expect(second).toMatchObject({ outcome: "poison", deadLetterId: (first as { deadLetterId: string }).deadLetterId });
    expect(alerts.sent).toHaveLength(1); // one dead letter, one alert
  });
});

describe("rate limits", () => {
  test("a 429 from a provider backs off honouring Retry-After, never spends an attempt and never dead-letters", async () => {
    let runs = 0;
    const attempts: number[] = [];
    const consumer = pointsConsumer({
      async handle(data, { tx, envelope, attempt }) {
        runs += 1;
        attempts.push(attempt);
        if (runs <= 8) throw Object.assign(new Error("Too Many Requests"), { status: 429, retryAfter: "7" });
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "rl", amount: data.points });
      },
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const deliveries: DeliveryEvent[] = [];
    queue.onDelivery((e) => deliveries.push(e));
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now })));
    await queue.publish(consumer.queue, award());
    await queue.drain();

    expect(runs).toBe(9); // more than the 5-attempt budget, and still not dead-lettered
    expect(new Set(attempts)).toEqual(new Set([1]));
    for (const event of deliveries.slice(0, 8)) {
      expect(event.result).toMatchObject({
        outcome: "rate_limited",
        ack: false,
        retryAfterMs: 7000,
        spendsAttempt: false,
      });
    }
    const gaps = deliveries.slice(1).map((e, i) => e.at - (deliveries[i]?.at ?? 0));
    expect(new Set(gaps)).toEqual(new Set([7000]));
    expect(await deadLetterRows()).toHaveLength(0);
    expect(await effectCount()).toBe(1);
    await queue.close();
  });

  test("a RateLimitedError without Retry-After backs off by the policy's first (jittered) delay", async () => {
    const consumer = pointsConsumer({
      async handle() {
        throw new RateLimitedError("mail provider bucket empty");
      },
    });
    const result = await bindConsumer(consumer, deps({ random: () => 0.5 })).deliver({
      body: JSON.stringify(award()),
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "rate_limited", retryAfterMs: 22_500, spendsAttempt: false });
  });
});

describe("dead-letter write failures", () => {
  test("when the dead letter cannot be written the delivery is not acknowledged, and it lands once the database is back", async () => {
    // A real failure inside Postgres: every insert into dead_letters raises.
    await pg.sql.unsafe(`
      create or replace function test_refuse_dead_letters() returns trigger language plpgsql as
        $$ begin raise exception 'disk full (simulated)'; end $$;
      create trigger refuse_dead_letters before insert on core.dead_letters
        for each row execute function test_refuse_dead_letters();`);
    try {
      const clock = createManualClock();
      const queue = createMemoryQueue({ clock, visibilityTimeoutMs: 60_000 });
      const deliveries: DeliveryEvent[] = [];
      queue.onDelivery((e) => deliveries.push(e));
      const metrics = recordingMetrics();
      const consumer = pointsConsumer();
      queue.subscribe(bindConsumer(consumer, deps({ metrics: metrics.port, now: clock.now })));
      await queue.publishRaw(consumer.queue, "not json at all");
      // Let the first delivery finish without advancing the clock.
      while (deliveries.length === 0) await new Promise((r) => setTimeout(r, 5));

      expect(deliveries[0]?.result).toMatchObject({ outcome: "dead_letter_failed", ack: false });
      expect(deliveries[0]?.result).toHaveProperty("error", expect.stringContaining("disk full (simulated)"));
      expect(queue.pending()).toBe(1);
      expect(await deadLetterRows()).toHaveLength(0);
      expect(metrics.count("dead_letter_failed")).toBe(1);

      await pg.sql`drop trigger refuse_dead_letters on core.dead_letters`;
      await queue.drain(); // the visibility timeout passes, the message comes back
      expect(deliveries.map((d) => d.result.outcome)).toEqual(["dead_letter_failed", "poison"]);
      expect(deliveries[1]?.at).toBe((deliveries[0]?.at ?? 0) + 60_000);
      expect(await deadLetterRows()).toHaveLength(1);
      expect(queue.pending()).toBe(0);
      await queue.close();
    } finally {
      await pg.sql`drop trigger if exists refuse_dead_letters on core.dead_letters`;
    }
  });
});

describe("database unreachable", () => {
  // A real client to a port where nothing listens: every query fails to connect.
  const unreachable = () => {
    const client = postgres("postgres://postgres@127.0.0.1:1/none", { max: 1, connect_timeout: 1, onnotice: () => {} });
    return { db: drizzle({ client }), close: () => client.end() };
  };

  test.each([
    ["a poison payload", "not json", 1],
    ["a delivery past the budget (its fence check fails)", JSON.stringify(award()), 7],
  ])("%s is not acknowledged when the database is down", async (_name, body, deliveryCount) => {
    const { db, close } = unreachable();
    try {
      const result = await bindConsumer(pointsConsumer(), deps({ db })).deliver({ body, deliveryCount });
      expect(result).toMatchObject({ outcome: "dead_letter_failed", ack: false });
    } finally {
      await close();
    }
  });

  test("a delivery whose handler cannot start, even the last attempt, is deferred with growing waits and spends no attempt (#8 item 8)", async () => {
    const { db, close } = unreachable();
    let ran = 0;
    const consumer = bindConsumer(
      pointsConsumer({
        async handle() {
          ran += 1;
        },
      }),
      deps({ db, random: () => 0.999 }),
    );
    try {
      const body = JSON.stringify(award());
      const waits: number[] = [];
      for (let deferrals = 0; deferrals < 4; deferrals++) {
        const result = await consumer.deliver({ body, deliveryCount: 5, deferrals });
        expect(result).toMatchObject({ outcome: "deferred", ack: false, spendsAttempt: false });
        if (result.outcome === "deferred") waits.push(result.retryAfterMs);
      }
      expect(ran).toBe(0);
      expect(waits).toEqual([...waits].sort((a, b) => a - b));
      expect(new Set(waits).size).toBe(4);
    } finally {
      await close();
    }
  });
});

describe("alerts", () => {
  test("a new dead letter alerts with ids and the error class, never the payload", async () => {
    const alerts = recordingAlerts();
    const consumer = pointsConsumer({
      async handle() {
        throw new PermanentError("rejected");
      },
    });
    const envelope = createEnvelope({
      tenantId: "t-9",
      kind: "points.award.v1",
      data: { customerId: "secret-person@example.com", points: 3 },
    });
    const result = await bindConsumer(consumer, deps({ alerts: alerts.port })).deliver({
      body: JSON.stringify(envelope),
      deliveryCount: 1,
    });
    expect(alerts.sent).toEqual([
      {
        deadLetterId: (result as { deadLetterId: string }).deadLetterId,
        jobId: envelope.job_id,
        queue: consumer.queue,
        consumer: consumer.name,
        tenantId: "t-9",
        kind: "points.award.v1",
        correlationId: envelope.correlation_id,
        errorClass: "permanent",
        attempts: 1,
        error: "PermanentError: rejected",
      },
    ]);
    expect(JSON.stringify(alerts.sent)).not.toContain("secret-person");
  });

  test("a poison payload's alert quotes nothing of the payload", async () => {
    const alerts = recordingAlerts();
    const body = '{"email": jane.doe@example.com, "points": 3}';
    await bindConsumer(pointsConsumer(), deps({ alerts: alerts.port })).deliver({ body, deliveryCount: 1 });
    expect(alerts.sent).toHaveLength(1);
    expect(alerts.sent[0]?.error).toBe("payload is not JSON (SyntaxError)");
    expect(JSON.stringify(alerts.sent)).not.toMatch(/jane|example\.com/);
    expect((await deadLetterRows())[0]?.payload).toBe(body); // the evidence stays in the row
  });

  test.each(["reject", "throw"] as const)(
    "an alert sink that fails (%s) neither blocks nor loses the dead letter",
    async (behaviour) => {
      const alerts = recordingAlerts(behaviour);
      const metrics = recordingMetrics();
      const result = await bindConsumer(pointsConsumer(), deps({ alerts: alerts.port, metrics: metrics.port })).deliver(
        {
          body: "garbage",
          deliveryCount: 1,
        },
      );
      expect(result).toMatchObject({ outcome: "poison", ack: true });
      expect(await deadLetterRows()).toHaveLength(1);
      await new Promise((r) => setTimeout(r, 10));
      expect(metrics.alertFailures).toBe(1);
    },
  );
});

describe("ordering keys", () => {
  test("jobs with the same ordering key run one at a time, others in parallel", async () => {
    let running = 0;
    let maxRunning = 0;
    const consumer = pointsConsumer({
      orderingKey: (data) => data.customerId,
      async handle(data, { tx, envelope }) {
        running += 1;
        maxRunning = Math.max(maxRunning, running);
        await tx.execute(dsql`select pg_sleep(0.05)`);
        running -= 1;
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "ordered", amount: data.points });
      },
    });
    const sameCustomer = Array.from({ length: 6 }, () =>
      createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c-same", points: 1 } }),
    );
    const bound = Array.from({ length: 6 }, () => bindConsumer(consumer, deps({ db: pg.connect({ max: 1 }).db })));
    await Promise.all(sameCustomer.map((e, i) => bound[i]?.deliver({ body: JSON.stringify(e), deliveryCount: 1 })));
    expect(maxRunning).toBe(1);

    maxRunning = 0;
    const distinct = Array.from({ length: 6 }, (_, i) =>
      createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: `c-${i}`, points: 1 } }),
    );
    await Promise.all(distinct.map((e, i) => bound[i]?.deliver({ body: JSON.stringify(e), deliveryCount: 1 })));
    expect(maxRunning).toBeGreaterThan(1);
    expect(await effectCount()).toBe(12);
  });
});

test("fence rows name the job and the consumer", async () => {
  const consumer = pointsConsumer();
  const envelope = award();
  await bindConsumer(consumer, deps()).deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });
  const rows = await pg.db.select().from(processedJobs).where(eq(processedJobs.jobId, envelope.job_id));
  expect(rows).toHaveLength(1);
  expect(rows[0]?.consumer).toBe(consumer.name);
});

describe("defineConsumer", () => {
  const base = { name: "ok.name", queue: "ok.queue", kind: "k.v1", schema: z.object({}), handle: async () => {} };
  test.each([
    [{ name: "" }, /name must be/],
    [{ name: "has space" }, /name must be/],
    [{ queue: "" }, /queue must be/],
    [{ kind: [] }, /kind must be a non-empty string/],
    [{ schema: {} }, /schema must be a Zod schema/],
    [{ handle: "nope" }, /handle must be a function/],
    [{ maxAgeMs: 0 }, /maxAgeMs must be a positive number/],
    [{ retry: { maxAttempts: 0 } }, /retry.maxAttempts/],
    [{ batch: { maxSize: 0, maxWaitMs: 2 } }, /batch.maxSize must be a whole number of jobs from 1 to 64/],
    [{ batch: { maxSize: 65, maxWaitMs: 2 } }, /batch.maxSize/],
    [{ batch: { maxSize: 8, maxWaitMs: -1 } }, /batch.maxWaitMs must be a number of milliseconds/],
    [{ batch: { maxSize: 8, maxWaitMs: 2, concurrent: "yes" } }, /batch.concurrent must be true or false, got yes/],
  ])("refuses %j at definition time with InvalidConfigError", (patch, message) => {
    expect(() => defineConsumer({ ...base, ...patch } as never)).toThrow(InvalidConfigError);
    expect(() => defineConsumer({ ...base, ...patch } as never)).toThrow(message);
  });

  test("accepts several kinds (a new schema version is a new kind)", async () => {
    const consumer = pointsConsumer({ kind: ["points.award.v1", "points.award.v2"] });
    const v2 = createEnvelope({ tenantId: "t", kind: "points.award.v2", data: { customerId: "c", points: 2 } });
    expect((await bindConsumer(consumer, deps()).deliver({ body: JSON.stringify(v2), deliveryCount: 1 })).outcome).toBe(
      "success",
    );
  });

  test("bindConsumer refuses something that is not a Drizzle database", () => {
    expect(() => bindConsumer(pointsConsumer(), { db: {} as never })).toThrow(
      /deps.db must be a Drizzle Postgres database/,
    );
  });
});
