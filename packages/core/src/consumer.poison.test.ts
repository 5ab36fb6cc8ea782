/**
 * Issue 8 items 5-7: what the harness does with payloads that throw while
 * being validated, with copies of one poison message, and with a failure
 * whose dead letter could not be written. On real Postgres, with real Zod
 * schemas.
 */
import { createHash } from "node:crypto";
import { eq } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, recordingAlerts, recordingMetrics, silentLogger, useEffectsDatabase } from "../test/fixtures.ts";
import { createMemoryQueue, type DeliveryEvent } from "./adapters/memory/index.ts";
import { createManualClock } from "./clock.ts";
import { bindConsumer, type ConsumerDefinition, defineConsumer, type HarnessDeps } from "./consumer.ts";
import { deadLetters } from "./db/schema.ts";
import { createEnvelope } from "./envelope.ts";
import { PermanentError } from "./errors.ts";
import { createOps } from "./ops/index.ts";

const pg = useEffectsDatabase("consumer_poison");

let seq = 0;
function consumerOf<TSchema extends z.ZodType>(schema: TSchema, overrides: Partial<ConsumerDefinition<TSchema>> = {}) {
  seq += 1;
  const name = `poison.c-${seq}`;
  return defineConsumer<TSchema>({
    name,
    queue: `poison.q-${seq}`,
    kind: "points.award.v1",
    schema,
    async handle(_data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: 1 });
    },
    ...overrides,
  });
}

const awardSchema = z.object({ customerId: z.string(), points: z.number() });
const envelopeOf = (data: unknown) => createEnvelope({ tenantId: "tenant-p", kind: "points.award.v1", data });
const deps = (extra: Partial<HarnessDeps> = {}): HarnessDeps => ({ db: pg.db, logger: silentLogger, ...extra });
const letters = () => pg.db.select().from(deadLetters);
const count = async (table: string) =>
  (await pg.sql.unsafe<{ n: number }[]>(`select count(*)::int as n from ${table}`))[0]?.n;

/** The body of an envelope whose data is `{ tree }`, `tree` being `depth` nested arrays (too deep to build with JSON.stringify). */
const deepBody = (depth: number) => {
  const envelope = envelopeOf({ tree: 0 });
  const text = JSON.stringify(envelope).replace('"tree":0', `"tree":${"[".repeat(depth)}0${"]".repeat(depth)}`);
  return { envelope, text };
};

/** `depth` nested arrays around 0: valid JSON that recursive code cannot walk. */
const nested = (depth: number): unknown => {
  let value: unknown = 0;
  for (let i = 0; i < depth; i += 1) value = [value];
  return value;
};

describe("anything thrown while validating is poison (#8 item 5)", () => {
  const DEEP = Symbol("nested 10,000 levels");
  const cases: [string, z.ZodType, unknown, RegExp][] = [
    [
      "a transform calling new URL() on a bad URL",
      z.object({ callback: z.string().transform((s) => new URL(s)) }),
      { callback: "not a url" },
      /validating data for points\.award\.v1 threw TypeError: Invalid URL/,
    ],
    [
      "a transform calling BigInt() on a non-number",
      z.object({ amount: z.string().transform((s) => BigInt(s)) }),
      { amount: "12x" },
      /threw SyntaxError: Cannot convert 12x to a BigInt/,
    ],
    [
      "z.json() on data nested 10,000 levels deep",
      z.object({ tree: z.json() }),
      DEEP,
      /threw RangeError: Maximum call stack size exceeded/,
    ],
    [
      "a refine that throws",
      z.object({ sku: z.string().refine((s) => JSON.parse(s) !== null) }),
      { sku: "{oops" },
      /threw SyntaxError: /,
    ],
  ];

  test.each(cases)(
    "a schema with %s dead-letters the job as poison with the exception's class and message, zero retries, handler never run",
    async (_name, schema, data, error) => {
      let runs = 0;
      const consumer = consumerOf(schema, {
        async handle() {
          runs += 1;
        },
      });
      const alerts = recordingAlerts();
      const metrics = recordingMetrics();
      const { envelope, text } = data === DEEP ? deepBody(10_000) : { envelope: envelopeOf(data), text: "" };
      const body = text || JSON.stringify(envelope);
      const result = await bindConsumer(consumer, deps({ alerts: alerts.port, metrics: metrics.port })).deliver({
        body,
        deliveryCount: 1,
      });

      expect(result).toMatchObject({ outcome: "poison", ack: true, errorClass: "poison" });
      expect(runs).toBe(0);
      const rows = await letters();
      expect(rows).toHaveLength(1);
      expect(rows[0]).toMatchObject({
        jobId: envelope.job_id,
        errorClass: "poison",
        attempts: 0,
        status: "pending_review",
        payload: body,
      });
      expect(rows[0]?.lastError).toMatch(error);
      expect(alerts.sent.map((a) => a.errorClass)).toEqual(["poison"]);
      // The exception's message can quote payload values unquoted ("Cannot convert 12x"):
      // the alert names the stage and the exception's class only; the row keeps the text.
      expect(alerts.sent[0]?.error).toMatch(/^validating data for points\.award\.v1 threw \w+$/);
      expect(metrics.count("poison")).toBe(1);
      expect(await count("core.processed_jobs")).toBe(0);
    },
  );

  test("through a transport, a schema that throws is delivered once and acknowledged, never redelivered", async () => {
    const consumer = consumerOf(z.object({ amount: z.string().transform((s) => BigInt(s)) }));
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const first = new Promise<DeliveryEvent>((resolve) => queue.onDelivery(resolve));
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now })));
    try {
      await queue.publish(consumer.queue, envelopeOf({ amount: "twelve" }));
      // Not drain(): on a delivery that rejects, the queue would redeliver it forever.
      expect((await first).result).toMatchObject({ outcome: "poison", ack: true });
      expect(queue.pending()).toBe(0);
      expect(await letters()).toHaveLength(1);
    } finally {
      await queue.close();
    }
  });

  test("a body the transport already decoded that cannot be read (a throwing getter) is poison, not a rejected delivery", async () => {
    const body = {
      get job_id(): string {
        throw new Error("getter exploded");
      },
    };
    const result = await bindConsumer(consumerOf(awardSchema), deps()).deliver({ body, deliveryCount: 1 });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    expect((await letters())[0]?.lastError).toMatch(/threw Error: getter exploded/);
  });

  test("a decoded body nested too deeply to stringify, checked by z.json(), is poison, not a rejected delivery", async () => {
    const body = envelopeOf({ tree: 1 }) as { data: unknown };
    const deep = { ...body, data: { tree: nested(100_000) } };
    const result = await bindConsumer(consumerOf(z.object({ tree: z.json() })), deps()).deliver({
      body: deep,
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    expect((await letters())[0]?.lastError).toMatch(/RangeError: Maximum call stack size exceeded/);
  });

  test("a schema that throws something that is not an Error, even a value that throws when read, is still poison", async () => {
    const hostile = new Proxy(
      {},
      {
        get: () => {
          throw new Error("no");
        },
        getPrototypeOf: () => {
          throw new Error("no");
        },
      },
    );
    const consumer = consumerOf(
      z.object({
        customerId: z.string().transform(() => {
          throw hostile;
        }),
      }),
    );
    const result = await bindConsumer(consumer, deps()).deliver({
      body: JSON.stringify(envelopeOf({ customerId: "c-1" })),
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    expect((await letters())[0]?.lastError).toMatch(/threw something that cannot even be described/);
  });

  test.each([
    [
      "throws",
      () => {
        throw new TypeError("customerId.toUpperCase is not a function");
      },
      /computing .*'s ordering key threw TypeError: customerId\.toUpperCase/,
    ],
    ["returns something other than a string", () => 42 as unknown as string, /it returned number, not a string/],
  ])(
    "an orderingKey that %s makes the job poison before any transaction, spending no attempt",
    async (_name, orderingKey, error) => {
      let runs = 0;
      const consumer = consumerOf(awardSchema, {
        orderingKey,
        async handle() {
          runs += 1;
        },
      });
      const result = await bindConsumer(consumer, deps()).deliver({
        body: JSON.stringify(envelopeOf({ customerId: "c-1", points: 1 })),
        deliveryCount: 1,
      });
      expect(result).toMatchObject({ outcome: "poison", ack: true });
      expect(runs).toBe(0);
      expect((await letters())[0]).toMatchObject({ errorClass: "poison", attempts: 0 });
      expect((await letters())[0]?.lastError).toMatch(error);
    },
  );

  test("a schema with an async refinement validates the data instead of throwing on every message", async () => {
    const consumer = consumerOf(
      z.object({ customerId: z.string().refine(async (id) => id.startsWith("c-"), "unknown customer") }),
    );
    const bound = bindConsumer(consumer, deps());
    const ok = await bound.deliver({ body: JSON.stringify(envelopeOf({ customerId: "c-9" })), deliveryCount: 1 });
    const bad = await bound.deliver({ body: JSON.stringify(envelopeOf({ customerId: "x-9" })), deliveryCount: 1 });
    expect(ok).toMatchObject({ outcome: "success" });
    expect(bad).toMatchObject({ outcome: "poison" });
    expect((await letters())[0]?.lastError).toMatch(/customerId: unknown customer/);
  });
});

describe("one poison message, one letter (#8 item 6)", () => {
  const sha256 = (bytes: string | Uint8Array) => createHash("sha256").update(bytes).digest("hex");

  test("8 copies of one non-JSON message delivered in parallel on separate connections write one letter and one alert", async () => {
    const consumer = consumerOf(awardSchema);
    const alerts = recordingAlerts();
    const body = "{this is not json";
    // Each copy gets its own pool: the inserts race in Postgres, not in this
    // process. An uncommitted letter of the same payload holds all 8 at the
    // unique index until every one of them is waiting there, so they do race.
    const blocker = await pg.connect({ max: 1 }).sql.reserve();
    await blocker`begin`;
    await blocker`insert into core.dead_letters (id, queue, consumer, payload, attempts, last_error, error_class, payload_sha256)
      values (gen_random_uuid(), ${consumer.queue}, ${consumer.name}, ${body}, 0, 'blocker', 'poison', ${sha256(body)})`;
    const bound = Array.from({ length: 8 }, () =>
      bindConsumer(consumer, deps({ db: pg.connect({ max: 1 }).db, alerts: alerts.port })),
    );
    let settled = false;
    const delivered = Promise.all(
      bound.map((b, i) => b.deliver({ body, deliveryCount: 1, messageId: `msg-${i}` })),
    ).finally(() => {
      settled = true; // without de-duplication nothing waits on the blocker
    });
    while (!settled) {
      const [row] = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity
        where datname = current_database() and wait_event_type = 'Lock' and query like '%insert into core.dead_letters as d %'`;
      if (row?.n === 8) break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await blocker`rollback`;
    blocker.release();
    const results = await delivered;

    const rows = await letters();
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ jobId: null, occurrences: 8, payload: body, payloadSha256: sha256(body) });
    expect(new Set(results.map((r) => r.outcome))).toEqual(new Set(["poison"]));
    expect(new Set(results.map((r) => (r as { deadLetterId: string }).deadLetterId))).toEqual(new Set([rows[0]?.id]));
    expect(alerts.sent).toHaveLength(1);
  });

  test("redelivered copies of bytes that are not UTF-8 update one letter; other bytes and other consumers get their own", async () => {
    const alerts = recordingAlerts();
    const consumer = consumerOf(awardSchema);
    const bound = bindConsumer(consumer, deps({ alerts: alerts.port }));
    const bytes = new Uint8Array([0xff, 0xfe, 0x00, 0x41]);
    for (let i = 1; i <= 3; i += 1) await bound.deliver({ body: bytes, deliveryCount: i, messageId: `m-${i}` });
    await bound.deliver({ body: new Uint8Array([0xff, 0xfe, 0x00, 0x42]), deliveryCount: 1 });
    await bindConsumer(consumerOf(awardSchema), deps({ alerts: alerts.port })).deliver({
      body: bytes,
      deliveryCount: 1,
    });

    const rows = await pg.db.select().from(deadLetters).orderBy(deadLetters.id);
    expect(rows.map((r) => [r.consumer, r.occurrences])).toEqual([
      [consumer.name, 3],
      [consumer.name, 1],
      [`poison.c-${seq}`, 1],
    ]);
    expect(rows[0]?.payloadSha256).toBe(sha256(bytes));
    expect(alerts.sent).toHaveLength(3);
  });

  test("a letter without a job_id can be read and discarded by an operator; a copy arriving after the discard is a new letter", async () => {
    const consumer = consumerOf(awardSchema);
    const bound = bindConsumer(consumer, deps());
    const ops = createOps({
      db: pg.db,
      queue: {
        publish: async () => ({ messageId: null, stored: true }),
        schedule: async () => ({ messageId: null, stored: true }),
      },
    });
    await bound.deliver({ body: "<xml/>", deliveryCount: 1 });
    await bound.deliver({ body: "<xml/>", deliveryCount: 2 });
    const [row] = await letters();
    const detail = await ops.deadLetters.get(row?.id as string);
    expect(detail).toMatchObject({ jobId: null, occurrences: 2, payloadText: "<xml/>", related: [] });
    const replay = await ops.deadLetters.replay([row?.id as string], { operator: "ana", reason: "try" });
    expect(replay.results[0]).toMatchObject({ outcome: "not_replayable" });
    const discard = await ops.deadLetters.discard([row?.id as string], { operator: "ana", reason: "producer bug" });
    expect(discard.counts).toEqual({ discarded: 1 });

    await bound.deliver({ body: "<xml/>", deliveryCount: 3 });
    const rows = await pg.db.select().from(deadLetters).orderBy(deadLetters.id);
    expect(rows.map((r) => [r.status, r.occurrences])).toEqual([
      ["discarded", 2],
      ["pending_review", 1],
    ]);
  });
});

describe("a letter folds copies of the same bytes only (#18 item 4)", () => {
  test.each([
    ["empty", ""],
    ["NUL", "\u0000"],
    ["'undefined'", "undefined"],
    ["70 KB", "x".repeat(70_000)],
    ["a UUID v4", "0b4bd1d4-9d5b-4c5e-8f0a-3d1c8f2b6a11"],
  ])(
    "poison whose job_id is %s (not a UUID v7): each payload is a letter of its own, copies of one payload fold",
    async (_name, badId) => {
      const consumer = consumerOf(awardSchema);
      const bound = bindConsumer(consumer, deps());
      // Two jobs of a producer bug that sends one placeholder id for every job, and a copy of the first.
      const first = JSON.stringify({ ...envelopeOf({ customerId: "c-1", points: 10 }), job_id: badId });
      const second = JSON.stringify({ ...envelopeOf({ customerId: "c-2", points: 20 }), job_id: badId });
      for (const body of [first, second, first]) {
        expect(await bound.deliver({ body, deliveryCount: 1 })).toMatchObject({ outcome: "poison", ack: true });
      }
      const rows = await pg.db
        .select()
        .from(deadLetters)
        .where(eq(deadLetters.consumer, consumer.name))
        .orderBy(deadLetters.createdAt, deadLetters.id);
      const text = (r: (typeof rows)[number]) =>
        r.payloadEncoding === "base64" ? Buffer.from(r.payload, "base64").toString("utf8") : r.payload;
      expect(rows.map((r) => [text(r), r.occurrences, r.jobId])).toEqual([
        [first, 2, null],
        [second, 1, null],
      ]);
      expect(rows[0]?.lastError).toMatch(/job_id/);
    },
  );

  test("a valid job_id that arrives again with other bytes is one letter, and each payload's evidence is kept exactly", async () => {
    const consumer = consumerOf(awardSchema);
    const bound = bindConsumer(consumer, deps());
    const job = envelopeOf({ customerId: "c-1", points: "ten" });
    const a = JSON.stringify(job);
    const b = JSON.stringify({ ...job, data: { customerId: "c-1", points: "eleven" } });
    const c = ` ${a}`; // the same JSON, other bytes
    for (const body of [a, b, b, c]) {
      expect(await bound.deliver({ body, deliveryCount: 1 })).toMatchObject({ outcome: "poison" });
    }
    const rows = await letters();
    expect(rows.map((r) => [r.jobId, r.payload, r.occurrences])).toEqual([[job.job_id, a, 4]]);
    const ops = createOps({
      db: pg.db,
      queue: {
        publish: async () => ({ messageId: null, stored: true }),
        schedule: async () => ({ messageId: null, stored: true }),
      },
    });
    const detail = await ops.deadLetters.get(rows[0]?.id as string);
    expect(detail.otherPayloads.map((o) => [o.payloadText, o.occurrences])).toEqual([
      [b, 2],
      [c, 1],
    ]);
    expect(detail.otherPayloads[0]?.lastError).toMatch(/invalid data/);
  });

  test("2,000 fuzzed poison bodies through the in-process queue: one letter per distinct payload, none folded into another's", async () => {
    const consumer = consumerOf(awardSchema);
    const queue = createMemoryQueue({ clock: createManualClock() });
    const placeholders = ["", "undefined", "null", "\u0000", "0", "job"];
    const bodies = Array.from({ length: 2_000 }, (_, i) =>
      i % 3 === 0
        ? `{"broken ${i}`
        : JSON.stringify({
            ...envelopeOf({ customerId: `c-${i}`, points: i }),
            job_id: placeholders[i % placeholders.length],
          }),
    );
    queue.subscribe(bindConsumer(consumer, deps()));
    for (const body of bodies) await queue.publishRaw(consumer.queue, body);
    await queue.drain();
    await queue.close();
    const [row] = await pg.sql<{ letters: number; distinct_payloads: number; occurrences: number }[]>`
      select count(*)::int as letters, count(distinct payload)::int as distinct_payloads, sum(occurrences)::int as occurrences
      from core.dead_letters where consumer = ${consumer.name}`;
    expect(row).toEqual({ letters: 2_000, distinct_payloads: 2_000, occurrences: 2_000 });
  }, 60_000);
});

describe("honest evidence after a failed dead-letter write (#8 item 7)", () => {
  /** A real failure inside Postgres: until restored, every insert into core.dead_letters raises. */
  async function refuseDeadLetters(): Promise<() => Promise<void>> {
    await pg.sql.unsafe(`
      create or replace function test_refuse_dead_letters() returns trigger language plpgsql as
        $$ begin raise exception 'could not extend file (simulated disk full)'; end $$;
      create trigger refuse_dead_letters before insert on core.dead_letters
        for each row execute function test_refuse_dead_letters();`);
    return async () => {
      await pg.sql`drop trigger if exists refuse_dead_letters on core.dead_letters`;
    };
  }

  async function withRefusedDeadLetters<T>(work: () => Promise<T>): Promise<T> {
    const restore = await refuseDeadLetters();
    try {
      return await work();
    } finally {
      await restore();
    }
  }

  test("a permanent failure whose letter could not be written is dead-lettered as permanent with the handler's error by the delivery past the budget", async () => {
    let runs = 0;
    const consumer = consumerOf(awardSchema, {
      async handle() {
        runs += 1;
        throw new PermanentError("card declined: insufficient funds");
      },
    });
    const bound = bindConsumer(consumer, deps());
    const body = JSON.stringify(envelopeOf({ customerId: "c-1", points: 5 }));

    const first = await withRefusedDeadLetters(() => bound.deliver({ body, deliveryCount: 1 }));
    expect(first).toMatchObject({ outcome: "dead_letter_failed", ack: false });
    expect(await letters()).toHaveLength(0);

    const later = await bound.deliver({ body, deliveryCount: 6 });
    expect(later).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    expect(runs).toBe(1);
    const [row] = await letters();
    expect(row).toMatchObject({ errorClass: "permanent", attempts: 1 });
    expect(row?.lastError).toMatch(/^PermanentError: card declined: insufficient funds/);
    expect(row?.lastError).not.toMatch(/crashed or timed out/);
  });

  test("the last attempt's transient error whose letter could not be written is kept: exhausted, 5 attempts, the real error", async () => {
    const consumer = consumerOf(awardSchema, {
      async handle() {
        throw new Error("SMTP 421 service not available");
      },
    });
    const bound = bindConsumer(consumer, deps());
    const body = JSON.stringify(envelopeOf({ customerId: "c-1", points: 5 }));

    const last = await withRefusedDeadLetters(() => bound.deliver({ body, deliveryCount: 5 }));
    expect(last).toMatchObject({ outcome: "dead_letter_failed" });
    await bound.deliver({ body, deliveryCount: 6 });
    const [row] = await letters();
    expect(row).toMatchObject({ errorClass: "exhausted", attempts: 5 });
    expect(row?.lastError).toMatch(/^Error: SMTP 421 service not available/);
  });

  test("a process that knows nothing of the earlier attempts says their outcome is unknown, naming every possible cause", async () => {
    const consumer = consumerOf(awardSchema, {
      async handle() {
        throw new PermanentError("card declined");
      },
    });
    const body = JSON.stringify(envelopeOf({ customerId: "c-1", points: 5 }));
    await withRefusedDeadLetters(() => bindConsumer(consumer, deps()).deliver({ body, deliveryCount: 1 }));

    // Another worker process (a fresh binding remembers nothing) gets the redelivery.
    await bindConsumer(consumer, deps()).deliver({ body, deliveryCount: 6 });
    const [row] = await letters();
    expect(row).toMatchObject({ errorClass: "exhausted", attempts: 5 });
    expect(row?.lastError).toMatch(/outcome of the earlier attempts is unknown/);
    expect(row?.lastError).toMatch(
      /crashed or timed out the worker, or they failed and their dead letter could not be written/,
    );
  });

  test("a permanent failure whose letter failed, then a transient failure on the last attempt: the letter keeps both causes", async () => {
    const errors = [new PermanentError("account closed"), new Error("connect ETIMEDOUT 10.0.0.7:443")];
    let runs = 0;
    const consumer = consumerOf(awardSchema, {
      async handle() {
        runs += 1;
        throw errors[runs - 1];
      },
    });
    const bound = bindConsumer(consumer, deps());
    const body = JSON.stringify(envelopeOf({ customerId: "c-1", points: 5 }));

    await withRefusedDeadLetters(() => bound.deliver({ body, deliveryCount: 4 }));
    // Within the budget the handler runs again (inside the fence: no double effect).
    const last = await bound.deliver({ body, deliveryCount: 5 });
    expect(runs).toBe(2);
    expect(last).toMatchObject({ outcome: "dead_lettered", errorClass: "exhausted" });
    const [row] = await letters();
    expect(row?.lastError).toMatch(/^Error: connect ETIMEDOUT 10\.0\.0\.7:443/);
    expect(row?.lastError).toMatch(
      /after attempt 4, a permanent dead letter could not be written: PermanentError: account closed/,
    );
    expect(await count("core.processed_jobs")).toBe(0);
  });
});
