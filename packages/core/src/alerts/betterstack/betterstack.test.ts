import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { useTestDatabase } from "@softcrum/testing";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { FakeIngest } from "../../../test/fake-betterstack.ts";
import { recordingMetrics, silentLogger } from "../../../test/fixtures.ts";
import { latch } from "../../../test/latch.ts";
import { type VercelHarness, vercelHarness } from "../../../test/vercel-transport.ts";
import { toVercelTopic } from "../../adapters/vercel/index.ts";
import { bindConsumer, defineConsumer, type HandlerContext } from "../../consumer.ts";
import { createEnvelope } from "../../envelope.ts";
import { PermanentError } from "../../errors.ts";
import type { DeadLetterAlert } from "../../ports/alerts.ts";
import { createBetterStackAlerts, errorFingerprint } from "./index.ts";

const pg = useTestDatabase("betterstack");

let ingest: FakeIngest;
let endpoint: string;
beforeEach(async () => {
  ingest = new FakeIngest();
  endpoint = await ingest.start();
  await pg.sql`truncate core.dead_letters, core.alert_windows cascade`;
});
afterEach(async () => {
  await ingest.stop();
});

const alert = (overrides: Partial<DeadLetterAlert> = {}): DeadLetterAlert => ({
  deadLetterId: "01a20000-0000-7000-8000-000000000001",
  jobId: "01a20000-0000-7000-8000-0000000000aa",
  queue: "loyalty.points",
  consumer: "loyalty.award-points",
  tenantId: "acme",
  kind: "points.award.v1",
  correlationId: "req-1",
  errorClass: "exhausted",
  attempts: 5,
  error: "Error: partner timed out after 3000 ms",
  ...overrides,
});
const sdk = { batchInterval: 20, retryCount: 0 };
/** The adapter pointed at the fake ingest, sending fast and without SDK retries. */
const alertsTo = (url: string, options: Partial<Parameters<typeof createBetterStackAlerts>[0]> = {}) =>
  createBetterStackAlerts({ sourceToken: "t", endpoint: url, sdkOptions: sdk, logger: silentLogger, ...options });

describe("BetterStack alerts through the real @logtail/node client", () => {
  test("a new dead letter sends one alert with its ids, class and error — and nothing of the payload", async () => {
    const secretPayload = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "jane@example.com", points: 5 },
    });
    const alerts = createBetterStackAlerts({ sourceToken: "tok-123", endpoint, sdkOptions: sdk, logger: silentLogger });
    const consumer = defineConsumer({
      name: "loyalty.award-points",
      queue: "loyalty.points",
      kind: "points.award.v1",
      schema: z.object({ customerId: z.string(), points: z.number() }),
      handle: async () => {
        throw new PermanentError("account closed");
      },
    });
    const result = await bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger }).deliver({
      body: JSON.stringify(secretPayload),
      deliveryCount: 1,
    });
    await alerts.flush();

    expect(ingest.requests[0]).toEqual({
      authorization: "Bearer tok-123",
      contentType: "application/msgpack",
      contentEncoding: "gzip",
    });
    expect(ingest.logs).toHaveLength(1);
    expect(ingest.logs[0]).toMatchObject({
      level: "error",
      message: "dead letter: permanent in loyalty.award-points (loyalty.points)",
      softcrum_alert: "dead_letter",
      dead_letter_id: (result as { deadLetterId: string }).deadLetterId,
      job_id: secretPayload.job_id,
      queue: "loyalty.points",
      consumer: "loyalty.award-points",
      tenant_id: "acme",
      kind: "points.award.v1",
      correlation_id: secretPayload.correlation_id,
      error_class: "permanent",
      attempts: 1,
      error: "PermanentError: account closed",
    });
    expect(JSON.stringify(ingest.logs)).not.toContain("jane@example.com");
    await alerts.close();
  });

  test("identical failures inside the window make one alert plus one summary with the count", async () => {
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 60_000 });
    for (let i = 0; i < 5; i++) {
      alerts.deadLetterCreated(
        alert({
          deadLetterId: `01a20000-0000-7000-8000-00000000000${i}`,
          error: `Error: partner timed out after ${3000 + i} ms`,
        }),
      );
    }
    alerts.deadLetterCreated(alert({ errorClass: "permanent", error: "PermanentError: closed" })); // another class: its own alert
    alerts.deadLetterCreated(alert({ consumer: "other.consumer" })); // another consumer: its own alert
    await alerts.flush();

    const single = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter");
    const summaries = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letters_coalesced");
    expect(single).toHaveLength(3);
    expect(summaries).toEqual([
      expect.objectContaining({
        count: 4,
        first_dead_letter_id: "01a20000-0000-7000-8000-000000000000",
        queue: "loyalty.points",
        consumer: "loyalty.award-points",
        error_class: "exhausted",
        error_fingerprint: errorFingerprint("Error: partner timed out after 3000 ms"),
      }),
    ]);
    await alerts.close();
  });

  test("after the window, the same failure alerts again", async () => {
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 50 });
    alerts.deadLetterCreated(alert());
    await new Promise((r) => setTimeout(r, 120));
    alerts.deadLetterCreated(alert());
    await alerts.flush();
    expect(ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter")).toHaveLength(2);
    await alerts.close();
  });

  test("an ingest answering 500 loses no dead letter and the failure is counted", async () => {
    ingest.status = 500;
    const metrics = recordingMetrics();
    const alerts = alertsTo(endpoint, { metrics: metrics.port });
    const consumer = defineConsumer({
      name: "a.c",
      queue: "a.q",
      kind: "k.v1",
      schema: z.object({}),
      handle: async () => {},
    });
    const result = await bindConsumer(consumer, {
      db: pg.db,
      alerts,
      metrics: metrics.port,
      logger: silentLogger,
    }).deliver({
      body: "not json",
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    await alerts.flush();
    expect(ingest.requests.length).toBeGreaterThan(0);
    expect(alerts.failed).toBe(1);
    expect(metrics.alertFailures).toBe(1);
    const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
    expect(row?.n).toBe(1);
    await alerts.close();
  });

  test("configuration errors are clear", () => {
    expect(() => createBetterStackAlerts({ sourceToken: "" })).toThrow(/sourceToken is required/);
    expect(() => createBetterStackAlerts({ sourceToken: "t", coalesceWindowMs: -1 })).toThrow(/coalesceWindowMs/);
  });

  test("fingerprints ignore ids, numbers and quoted values, not the words", () => {
    expect(errorFingerprint('order 12 "abc" not found')).toBe(errorFingerprint("order 9981 'zz' not found"));
    expect(errorFingerprint("order 12 not found")).not.toBe(errorFingerprint("order 12 was cancelled"));
  });
});

describe("alerts never carry payload values (#8 item 14)", () => {
  beforeAll(async () => {
    await pg.sql`create table if not exists test_customers (email text not null constraint test_customers_email_key unique)`;
  });
  beforeEach(async () => {
    await pg.sql`truncate test_customers`;
  });

  const customer = z.object({ email: z.string() });
  const importConsumer = (handle: (data: z.output<typeof customer>, ctx: HandlerContext) => Promise<void>) =>
    defineConsumer({
      name: "crm.import",
      queue: "crm.q",
      kind: "customer.import.v1",
      schema: customer,
      handle,
    });
  const body = (email: string) =>
    JSON.stringify(createEnvelope({ tenantId: "acme", kind: "customer.import.v1", data: { email } }));
  const letterError = async (id: string) =>
    (await pg.sql<{ last_error: string }[]>`select last_error from core.dead_letters where id = ${id}`)[0]?.last_error;

  test("a real 22P02 quoting the input alerts with its SQLSTATE and the value masked; the dead letter keeps the value (#8 item 14)", async () => {
    const alerts = alertsTo(endpoint);
    const consumer = importConsumer(async (data, { tx }) => {
      await tx.execute(sql`select ${data.email}::int`);
    });
    const result = await bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger }).deliver({
      body: body("jane.doe@example.com"),
      deliveryCount: 5,
    });
    expect(result).toMatchObject({ outcome: "dead_lettered", errorClass: "exhausted" });
    await alerts.close();

    expect(await letterError((result as { deadLetterId: string }).deadLetterId)).toContain(
      'invalid input syntax for type integer: "jane.doe@example.com"',
    );
    expect(ingest.logs).toHaveLength(1);
    expect(ingest.logs[0]).toMatchObject({
      softcrum_alert: "dead_letter",
      error_class: "exhausted",
      sqlstate: "22P02",
      error: expect.stringContaining('invalid input syntax for type integer: "<redacted>"'),
    });
    expect(JSON.stringify(ingest.logs)).not.toContain("jane.doe");
    expect(JSON.stringify(ingest.logs)).not.toContain("example.com");
  });

  test("a real 23505 whose Key detail the handler wrapped alerts with SQLSTATE, constraint and table, never the e-mail; the row keeps it (#8 item 14)", async () => {
    await pg.sql`insert into test_customers (email) values ('jane.doe@example.com')`;
    const alerts = alertsTo(endpoint);
    const consumer = importConsumer(async (data, { tx }) => {
      try {
        await tx.execute(sql`insert into test_customers (email) values (${data.email})`);
      } catch (thrown) {
        const pgError = ((thrown as { cause?: unknown }).cause ?? thrown) as { message: string; detail?: string };
        throw new PermanentError(`customer import refused: ${pgError.message}. ${pgError.detail ?? ""}`, {
          cause: thrown,
        });
      }
    });
    const result = await bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger }).deliver({
      body: body("jane.doe@example.com"),
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    await alerts.close();

    expect(await letterError((result as { deadLetterId: string }).deadLetterId)).toContain(
      "Key (email)=(jane.doe@example.com) already exists.",
    );
    expect(ingest.logs).toHaveLength(1);
    expect(ingest.logs[0]).toMatchObject({
      error_class: "permanent",
      sqlstate: "23505",
      constraint: "test_customers_email_key",
      table: "test_customers",
      error:
        'PermanentError: customer import refused: duplicate key value violates unique constraint "test_customers_email_key". Key (email)=(<redacted>) already exists. ← caused by PostgresError [query: insert into test_customers (email) values ($1)]',
    });
    expect(JSON.stringify(ingest.logs)).not.toContain("jane.doe");
  });

  test("the same failure with other values is one failure mode: one alert and a summary counting the rest (#8 item 14)", async () => {
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 60_000 });
    const consumer = importConsumer(async (data, { tx }) => {
      await tx.execute(sql`select ${data.email}::int`);
    });
    const bound = bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger });
    for (const email of ["a@example.com", "b.c@example.org", "d+e@example.net"]) {
      await bound.deliver({ body: body(email), deliveryCount: 5 });
    }
    await alerts.close();
    expect(ingest.logs.map((l) => [l["softcrum_alert"], l["count"]])).toEqual([
      ["dead_letter", undefined],
      ["dead_letters_coalesced", 2],
    ]);
    expect(JSON.stringify(ingest.logs)).not.toContain("example");
  });
});

describe("one alert per failure mode per window across the fleet (#8 item 15)", () => {
  const quietAlert = (i: number) =>
    alert({
      deadLetterId: `01a20000-0000-7000-8000-${String(i).padStart(12, "0")}`,
      error: `PostgresError: invalid input syntax for type integer: "customer-${i}@example.com"`,
    });

  test("independent adapters on their own pools racing on one failure send one alert; after the window the next alert carries the count (#8 item 15)", async () => {
    let clock = Date.parse("2026-01-01T00:00:00Z");
    const adapters = Array.from({ length: 5 }, () =>
      alertsTo(endpoint, { db: pg.connect({ max: 2 }).db, coalesceWindowMs: 60_000, now: () => clock }),
    );
    await Promise.all(
      Array.from({ length: 20 }, (_, i) => adapters[i % adapters.length]?.deadLetterCreated(quietAlert(i))),
    );
    clock += 60_000; // the window has ended
    await adapters[3]?.deadLetterCreated(quietAlert(99));
    await Promise.all(adapters.map((a) => a.close()));

    const sent = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter");
    expect(sent).toHaveLength(2);
    // Matched by letter, not by arrival order: each adapter's SDK batches and
    // flushes on its own, so the window's first alert may reach the server
    // after the next window's (as logs of several processes do).
    const next = sent.find((l) => l["dead_letter_id"] === quietAlert(99).deadLetterId);
    const first = sent.find((l) => l !== next);
    expect(first?.["dead_letter_id"]).toMatch(/^01a20000-0000-7000-8000-0000000000[01]\d$/);
    expect(first?.["previous_window_count"]).toBeUndefined();
    expect(next).toMatchObject({
      dead_letter_id: quietAlert(99).deadLetterId,
      previous_window_count: 19,
      previous_window_started_at: "2026-01-01T00:00:00.000Z",
    });
    // The window's count was carried by the next alert, so no summary repeats it.
    expect(ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letters_coalesced")).toEqual([]);
    expect(JSON.stringify(ingest.logs)).not.toContain("example.com");
  });

  test("several worker processes dead-lettering the same failure at once send one alert, and their summaries count every other letter once (#8 item 15)", async () => {
    const script = fileURLToPath(new URL("../../../test/alert-worker.ts", import.meta.url));
    const perProcess = 3;
    const children: ChildProcess[] = [];
    try {
      const runs = ["w1", "w2", "w3", "w4"].map((label) => {
        const child = spawn(
          process.execPath,
          ["--import", "tsx", script, pg.url, endpoint, String(perProcess), label],
          {
            cwd: fileURLToPath(new URL("../../..", import.meta.url)),
            stdio: ["pipe", "pipe", "pipe"],
          },
        );
        children.push(child);
        let output = "";
        let errors = "";
        const printed = (marker: string) =>
          new Promise<string>((resolve, reject) => {
            const check = () => output.includes(marker) && resolve(output);
            child.stdout?.on("data", (chunk) => {
              output += chunk;
              check();
            });
            child.stderr?.on("data", (chunk) => {
              errors += chunk;
            });
            child.on("exit", (code) =>
              reject(new Error(`${label} exited (${code}) before ${marker}: ${output}${errors}`)),
            );
            check();
          });
        return { child, ready: printed("READY"), done: printed("DONE") };
      });
      await Promise.all(runs.map((r) => r.ready));
      for (const r of runs) r.child.stdin?.write("GO\n");
      const outputs = await Promise.all(runs.map((r) => r.done));
      for (const output of outputs) expect(output).toContain(`DONE {"dead_lettered":${perProcess}}`);
    } finally {
      for (const child of children) if (child.exitCode === null) child.kill("SIGKILL");
    }

    const total = 4 * perProcess;
    const [letters] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
    expect(letters?.n).toBe(total);
    const sent = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter");
    const summaries = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letters_coalesced");
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatchObject({ sqlstate: "22P02", consumer: "fleet.import" });
    expect(summaries.reduce((n, l) => n + Number(l["count"]), 0)).toBe(total - 1);
    expect(JSON.stringify(ingest.logs)).not.toContain("example.com");
    const [window] = await pg.sql<{ unreported: number }[]>`select unreported from core.alert_windows`;
    expect(window?.unreported).toBe(0);
  }, 60_000);

  test("when the coalescing query fails or hangs, the alert is sent anyway and the dead letter is written (#8 item 15)", async () => {
    const shared = pg.connect({ max: 2 }).db;
    const first = alertsTo(endpoint, { db: shared, coalesceWindowMs: 60_000, coalesceTimeoutMs: 300 });
    const second = alertsTo(endpoint, { db: shared, coalesceWindowMs: 60_000, coalesceTimeoutMs: 300 });
    await first.deadLetterCreated(quietAlert(1));
    await second.deadLetterCreated(quietAlert(2)); // coalesced through the table
    await first.flush();
    expect(ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter")).toHaveLength(1);
    const [counted] = await pg.sql<{ unreported: number }[]>`select unreported from core.alert_windows`;
    expect(counted?.unreported).toBe(1);

    // The table is locked: the coalescing query hangs until the timeout, then the alert goes out anyway.
    const locker = pg.connect({ max: 1 });
    const held = latch();
    const locked = latch();
    const lock = locker.sql.begin(async (tx) => {
      await tx`lock table core.alert_windows in access exclusive mode`;
      locked.open();
      await held.opened;
    });
    await locked.opened;
    const consumer = defineConsumer({
      name: "loyalty.award-points",
      queue: "loyalty.points",
      kind: "points.award.v1",
      schema: z.object({}),
      handle: async () => {
        throw new PermanentError("account closed");
      },
    });
    const result = await bindConsumer(consumer, { db: pg.db, alerts: second, logger: silentLogger }).deliver({
      body: JSON.stringify(createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: {} })),
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "dead_lettered" });
    await second.flush();
    expect(ingest.logs.filter((l) => l["error_class"] === "permanent")).toHaveLength(1);
    held.open();
    await lock;

    // A database that cannot be reached: sent as well.
    const nowhere = postgres("postgres://postgres@127.0.0.1:1/none", {
      max: 1,
      connect_timeout: 5,
      onnotice: () => {},
    });
    const unreachable = alertsTo(endpoint, { db: drizzle({ client: nowhere }) });
    await unreachable.deadLetterCreated(alert({ errorClass: "expired", error: "job is old" }));
    await unreachable.close();
    await nowhere.end();
    expect(ingest.logs.filter((l) => l["error_class"] === "expired")).toHaveLength(1);
    await Promise.all([first.close(), second.close()]);
  });
});

describe("alerts are delivered before a serverless invocation answers (#9 item 8)", () => {
  let harness: VercelHarness | undefined;
  afterEach(async () => {
    await harness?.close();
    harness = undefined;
  });

  /** The SDK would hold these logs for a minute: only a flush delivers them before the response. */
  const slowBatches = { batchInterval: 60_000, retryCount: 0 };
  const unreported = async () =>
    (await pg.sql<{ n: number }[]>`select coalesce(sum(unreported), 0)::int as n from core.alert_windows`)[0]?.n;
  let seq = 0;
  const refusing = (reason: string) => {
    seq += 1;
    return defineConsumer({
      name: `serverless.c${seq}`,
      queue: `serverless.q${seq}`,
      kind: "account.sync.v1",
      schema: z.object({ account: z.string() }),
      handle: async (data) => {
        throw new PermanentError(`${reason} ${data.account}`);
      },
    });
  };
  const job = (account: string) => createEnvelope({ tenantId: "acme", kind: "account.sync.v1", data: { account } });

  test("the push route answers only once its letter's alert reached BetterStack, and coalesced letters are counted in Postgres by then; a later invocation reports a count its process never summarized (#9 item 8)", async () => {
    harness = await vercelHarness("push");
    const h = harness;
    let clock = Date.parse("2026-01-01T00:00:00Z");
    const shared = pg.connect({ max: 2 }).db;
    const alertsFor = () =>
      alertsTo(endpoint, { db: shared, coalesceWindowMs: 60_000, now: () => clock, sdkOptions: slowBatches });
    /** What BetterStack and the table held when each response returned. */
    const atResponse: { status: number; logs: number; unreported: number | undefined }[] = [];
    const route = (consumer: ReturnType<typeof refusing>, alerts: ReturnType<typeof alertsFor>) => {
      const handler = h.queue.pushHandler(bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger }));
      h.fake.subscribePush(
        toVercelTopic(consumer.queue),
        async (request) => {
          const response = await handler(request);
          atResponse.push({ status: response.status, logs: ingest.logs.length, unreported: await unreported() });
          return response;
        },
        { group: `route_${toVercelTopic(consumer.name)}` },
      );
    };

    // One function instance: three letters of one failure mode, one request each.
    const closedAccounts = refusing("account closed:");
    const first = alertsFor();
    route(closedAccounts, first);
    for (const account of ["acc-1001", "acc-2002", "acc-3003"]) {
      await h.queue.publish(closedAccounts.queue, job(account));
    }
    await h.fake.dispatch({ concurrency: 1 });
    expect(atResponse).toEqual([
      { status: 200, logs: 1, unreported: 0 },
      { status: 200, logs: 1, unreported: 1 },
      { status: 200, logs: 1, unreported: 2 },
    ]);
    expect(ingest.logs[0]).toMatchObject({ softcrum_alert: "dead_letter", error_class: "permanent" });

    // That instance is gone (never closed). After the window, another instance writes another letter:
    // before it answers, the 2 letters the first one counted are reported.
    clock += 60_000;
    const frozenAccounts = refusing("account frozen:");
    route(frozenAccounts, alertsFor());
    await h.queue.publish(frozenAccounts.queue, job("acc-4004"));
    await h.fake.dispatch({ concurrency: 1 });
    expect(atResponse.at(-1)).toEqual({ status: 200, logs: 3, unreported: 0 });
    expect(ingest.logs.slice(1)).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ softcrum_alert: "dead_letter", consumer: frozenAccounts.name }),
        expect.objectContaining({
          softcrum_alert: "dead_letters_coalesced",
          count: 2,
          consumer: closedAccounts.name,
          first_dead_letter_id: ingest.logs[0]?.["dead_letter_id"],
        }),
      ]),
    );
    await first.close(); // its summary finds nothing left to report
    expect(ingest.logs).toHaveLength(3);
  });

  test("receiveAvailable resolves only once its letters' alerts reached BetterStack; without a database, coalesced counts are sent at once (#9 item 8)", async () => {
    harness = await vercelHarness("poll");
    const consumer = refusing("account closed:");
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 60_000, sdkOptions: slowBatches });
    const bound = bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger });
    await harness.queue.publish(consumer.queue, job("acc-1"));
    expect(await harness.queue.receiveAvailable(bound)).toBe(1);
    expect(ingest.logs).toEqual([expect.objectContaining({ softcrum_alert: "dead_letter" })]);

    await harness.queue.publish(consumer.queue, job("acc-2"));
    await harness.queue.publish(consumer.queue, job("acc-3"));
    expect(await harness.queue.receiveAvailable(bound)).toBe(2);
    expect(ingest.logs.map((l) => [l["softcrum_alert"], l["count"]])).toEqual([
      ["dead_letter", undefined],
      ["dead_letters_coalesced", 2],
    ]);
    await alerts.close();
  });
});
