import { AssertionError } from "node:assert";
import { eq } from "drizzle-orm";
import { integer, pgTable, text, uuid } from "drizzle-orm/pg-core";
import { beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { deadLetters } from "../db/schema.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { PermanentError } from "../errors.ts";
import {
  anyTaskFailed,
  createManualClock,
  createTestQueue,
  deadLettersOf,
  deliver,
  expectOneEffect,
  fenceOf,
  findTestPostgres,
  finishDatabase,
  keptDatabaseMessage,
  shouldKeepDatabase,
  uniqueDatabaseName,
  useModuleDatabase,
  withAdmin,
  withDatabase,
} from "./index.ts";

const pg = useModuleDatabase();
const quiet = { warn: () => {}, error: () => {} };

/** One row per applied job, no unique key: a double effect shows. */
const effects = pgTable("test_effects", {
  jobId: uuid("job_id").notNull(),
  consumer: text("consumer").notNull(),
  points: integer("points").notNull(),
});

beforeAll(async () => {
  await pg.sql`create table test_effects (job_id uuid not null, consumer text not null, points integer not null)`;
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters cascade`;
});

const award = (points = 10): Envelope =>
  createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId: "c-1", points } });

/** A consumer that runs `before` first (throw to fail), then writes one effect row. */
function pointsConsumer(name: string, before: (attempt: number) => void = () => {}, maxAttempts = 5) {
  let attempt = 0;
  return defineConsumer({
    name,
    queue: "testing.points",
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    retry: { maxAttempts },
    async handle(data, { tx, envelope }) {
      attempt += 1;
      before(attempt);
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, points: data.points });
    },
  });
}

/** The consumer bound on `clock`, jitter fixed at its least (retry n waits base·2^(n-1)/2). */
function setup(consumer: ReturnType<typeof pointsConsumer>) {
  const clock = createManualClock(Date.parse("2030-01-01T00:00:00Z"));
  const bound = bindConsumer(consumer, { db: pg.db, now: clock.now, random: () => 0, logger: quiet });
  return { clock, bound, t: createTestQueue({ clock, consumers: [bound] }) };
}

describe("createTestQueue drains through backoff on the manual clock", () => {
  test("a consumer that fails twice then succeeds: three attempts, 15 s and 30 s apart, one effect, its fence", async () => {
    const { clock, t } = setup(
      pointsConsumer("flaky", (attempt) => {
        if (attempt <= 2) throw new Error("upstream answered 503");
      }),
    );
    const job = award(7);
    const started = Date.now();
    await t.publish(job);
    const report = await t.drain();
    expect(report.outcomes).toEqual(["retry", "retry", "success"]);
    const first = report.deliveries[0]?.at ?? Number.NaN;
    expect(report.deliveries.map((d) => [d.deliveryCount, d.at - first])).toEqual([
      [1, 0],
      [2, 15_000],
      [3, 45_000],
    ]);
    expect(report).toMatchObject({ pending: 0, elapsedMs: 45_000 });
    expect(clock.now()).toBe(Date.parse("2030-01-01T00:00:45Z"));
    expect(Date.now() - started).toBeLessThan(10_000); // clock time, not real time
    expect(t.outcomesOf(job.job_id)).toEqual(["retry", "retry", "success"]);
    const row = await expectOneEffect(pg.db, effects, { jobId: job.job_id });
    expect(row).toEqual({ jobId: job.job_id, consumer: "flaky", points: 7 });
    expect(await fenceOf(pg.db, job.job_id, "flaky")).toMatchObject({ jobId: job.job_id, consumer: "flaky" });
    expect(await deadLettersOf(pg.db, job.job_id)).toEqual([]);
    await t.close();
  });

  test("advance(ms) runs only what comes due within ms; drain({ maxMs }) throws when jobs are still pending", async () => {
    const { t } = setup(
      pointsConsumer("slow-to-heal", (attempt) => {
        if (attempt <= 2) throw new Error("still down");
      }),
    );
    const job = award();
    await t.publish(job);
    expect((await t.advance(10_000)).outcomes).toEqual(["retry"]);
    expect((await t.advance(5_000)).outcomes).toEqual(["retry"]); // due at exactly +15 s
    await expect(t.drain({ maxMs: 29_999 })).rejects.toThrow(
      /drain: 1 message\(s\) still pending after 29999 ms of clock time \(0 deliveries: none\); the next is due 30000 ms/,
    );
    expect(t.queue.pending()).toBe(1);
    expect((await t.drain()).outcomes).toEqual(["success"]);
    await expectOneEffect(pg.db, effects, { jobId: job.job_id });
    await t.close();
  });

  test("a job past its attempts is dead-lettered (exhausted) after the whole schedule", async () => {
    const { t } = setup(
      pointsConsumer(
        "always-down",
        () => {
          throw new Error("partner API down");
        },
        3,
      ),
    );
    const job = award();
    await t.publish(job);
    const report = await t.drain();
    expect(report.outcomes).toEqual(["retry", "retry", "dead_lettered"]);
    expect(report.elapsedMs).toBe(45_000);
    expect(await deadLettersOf(pg.db, job.job_id)).toEqual([
      expect.objectContaining({
        consumer: "always-down",
        status: "pending_review",
        errorClass: "exhausted",
        lastError: expect.stringContaining("partner API down"),
        attempts: 3,
      }),
    ]);
    await t.close();
  });
});

describe("duplicates", () => {
  test("deliverTwice: the second delivery is a duplicate, one effect", async () => {
    const { t } = setup(pointsConsumer("once"));
    const job = award();
    const report = await t.deliverTwice(job);
    expect(report.outcomes).toEqual(["success", "duplicate"]);
    await expectOneEffect(pg.db, effects, { jobId: job.job_id, consumer: "once" });
    await t.close();
  });

  test("deliverTwice concurrently: one success, one effect", async () => {
    const { t } = setup(pointsConsumer("racing"));
    const job = award();
    const report = await t.deliverTwice(job, { concurrently: true });
    expect(report.outcomes.filter((o) => o === "success")).toHaveLength(1);
    expect(report.outcomes).toContain("duplicate");
    expect(report.pending).toBe(0);
    await expectOneEffect(pg.db, effects, { jobId: job.job_id });
    await t.close();
  });

  test("deliver() hands one delivery straight to the consumer", async () => {
    const { bound, t } = setup(pointsConsumer("direct"));
    await t.close();
    const job = award();
    expect((await deliver(bound, job)).outcome).toBe("success");
    expect((await deliver(bound, JSON.stringify(job), { deliveryCount: 2 })).outcome).toBe("duplicate");
    await expectOneEffect(pg.db, effects, eq(effects.jobId, job.job_id));
  });
});

describe("assertions", () => {
  test("a permanent failure shows in deadLettersOf at once, with no fence and no effect", async () => {
    const { t } = setup(
      pointsConsumer("strict", () => {
        throw new PermanentError("customer account is closed");
      }),
    );
    const job = award();
    await t.publish(job);
    expect((await t.drain()).outcomes).toEqual(["dead_lettered"]);
    const letters = await deadLettersOf(pg.db, job.job_id);
    expect(letters).toEqual([
      {
        id: expect.any(String),
        queue: "testing.points",
        consumer: "strict",
        status: "pending_review",
        errorClass: "permanent",
        lastError: expect.stringContaining("customer account is closed"),
        attempts: 1,
        occurrences: 1,
      },
    ]);
    expect(await deadLettersOf(pg.db, job.job_id, { consumer: "someone-else" })).toEqual([]);
    expect(await fenceOf(pg.db, job.job_id, "strict")).toBeUndefined();
    await expect(expectOneEffect(pg.db, effects, { jobId: job.job_id })).rejects.toThrow(AssertionError);
    await t.close();
  });

  test("expectOneEffect names the table, the condition and the count on 0 and on 2 rows", async () => {
    const jobId = award().job_id;
    const zero = await expectOneEffect(pg.db, effects, { jobId }).catch((error: unknown) => error);
    expect(zero).toBeInstanceOf(AssertionError);
    expect((zero as AssertionError).message).toBe(
      `expectOneEffect: expected exactly 1 row in test_effects where jobId = "${jobId}", found 0`,
    );
    await pg.db.insert(effects).values([
      { jobId, consumer: "c", points: 1 },
      { jobId, consumer: "c", points: 1 },
    ]);
    const two = await expectOneEffect(pg.db, effects, eq(effects.jobId, jobId)).catch((error: unknown) => error);
    expect(two).toBeInstanceOf(AssertionError);
    expect((two as AssertionError).message).toBe(
      `expectOneEffect: expected exactly 1 row in test_effects where "test_effects"."job_id" = $1 (params "${jobId}"), found 2`,
    );
    await expect(expectOneEffect(pg.db, effects)).rejects.toThrow(/in test_effects, found 2$/);
    await expect(expectOneEffect(pg.db, deadLetters, {})).rejects.toThrow(/in core\.dead_letters, found 0/);
    await expect(expectOneEffect(pg.db, effects, { nope: 1 } as never)).rejects.toThrow(
      /test_effects has no column property "nope" \(it has jobId, consumer, points\)/,
    );
  });
});

describe("test databases", () => {
  test("this file's database is its own, named after the file", () => {
    expect(pg.name).toMatch(/^softcrum_t_.*testing_test_ts_[0-9a-f]{8}$/);
  });

  test("a database is kept when a test of its file failed (or SOFTCRUM_KEEP_TEST_DATABASES=1), else dropped", () => {
    expect(shouldKeepDatabase(false, {})).toBe(false);
    expect(shouldKeepDatabase(true, {})).toBe(true);
    expect(shouldKeepDatabase(false, { SOFTCRUM_KEEP_TEST_DATABASES: "1" })).toBe(true);
    const pass = { result: { state: "pass" } };
    expect(anyTaskFailed({ tasks: [pass, { tasks: [pass] }] })).toBe(false);
    expect(anyTaskFailed({ tasks: [pass, { tasks: [pass, { result: { state: "fail" } }] }] })).toBe(true);
    expect(anyTaskFailed({ result: { state: "fail" }, tasks: [] })).toBe(true);
    expect(anyTaskFailed(undefined)).toBe(false);
  });

  test("finishDatabase keeps a failed file's database, printing its name, and drops a passing one's", async () => {
    const adminUrl = withDatabase(pg.url, "postgres");
    const exists = (name: string) =>
      withAdmin(adminUrl, async (sql) => (await sql`select 1 from pg_database where datname = ${name}`).length === 1);
    const name = uniqueDatabaseName("softcrum_t", "finish");
    await withAdmin(adminUrl, (sql) => sql`create database ${sql(name)}`);
    const database = { adminUrl, name, url: withDatabase(adminUrl, name) };
    const lines: string[] = [];
    try {
      expect(await finishDatabase(database, true, { log: (line) => lines.push(line), env: {} })).toBe("kept");
      expect(await exists(name)).toBe(true);
      expect(lines).toEqual([keptDatabaseMessage(database, true)]);
      expect(lines[0]).toContain(`kept test database ${name} for inspection`);
      expect(await finishDatabase(database, false, { log: (line) => lines.push(line), env: {} })).toBe("dropped");
      expect(await exists(name)).toBe(false);
      expect(lines).toHaveLength(1);
    } finally {
      await withAdmin(adminUrl, (sql) => sql`drop database if exists ${sql(name)} with (force)`);
    }
  });

  test("no server at TEST_DATABASE_URL: a one-line error naming it, its password hidden", async () => {
    const error = await findTestPostgres({ TEST_DATABASE_URL: "postgres://app:s3cret@127.0.0.1:1/db" }).catch(
      (e: unknown) => e as Error,
    );
    expect(error).toBeInstanceOf(Error);
    const message = (error as Error).message;
    expect(message).toMatch(
      /^No usable Postgres at TEST_DATABASE_URL \(postgres:\/\/app:\*\*\*@127\.0\.0\.1:1\/db\): /,
    );
    expect(message).not.toContain("s3cret");
    expect(message).not.toContain("\n");
  });
});
