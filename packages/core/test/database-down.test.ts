// #12 item 3: the database goes down while a dead letter is due. The letter
// that cannot be written is not acknowledged; once Postgres is back the job
// ends as exactly one letter, every other job as exactly one effect, and the
// worker (the queue, the harness and the pool of this process) kept running
// through the outage and recovered without a restart. Runs on a throwaway
// cluster the test starts and stops itself, never on the shared server.
import { startThrowawayPostgres, type ThrowawayPostgres } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, expect, test } from "vitest";
import { z } from "zod";
import { createMemoryQueue, type DeliveryEvent } from "../src/adapters/memory/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { bindConsumer, createEnvelope, defineConsumer, PermanentError } from "../src/index.ts";
import { createEffectsTable, effects, silentLogger } from "./fixtures.ts";

let pg: ThrowawayPostgres | undefined;

beforeAll(async () => {
  pg = await startThrowawayPostgres({ migrate: migrateCore });
  const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
  await createEffectsTable(sql);
  await sql.end();
}, 60_000);

afterAll(async () => {
  await pg?.stop();
});

const cluster = () => {
  if (!pg) throw new Error("the throwaway cluster did not start");
  return pg;
};

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what: string, check: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`not reached in ${timeoutMs} ms: ${what}`);
    await sleep(10);
  }
}

test("a dead letter due while Postgres is stopped is not acknowledged; once it is back the job ends as one letter and every other job as one effect, with the same worker (#12 item 3)", async () => {
  const pool = postgres(cluster().url, {
    max: 4,
    connect_timeout: 2,
    // Reconnect within 0.2 s after a failure (postgres.js waits up to 20 s
    // by default): the same recovery, inside the test's time budget.
    backoff: () => 0.2,
    onnotice: () => {},
    connection: { application_name: "database-down" },
  });
  const db = drizzle({ client: pool });

  // Holds the rejected job's first run inside its work transaction until the server is down.
  let reachedGate = false;
  let openGate: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    openGate = resolve;
  });
  const schema = z.object({ n: z.number(), reject: z.boolean() });
  const retry = { maxAttempts: 5, baseDelayMs: 100, maxDelayMs: 800 };
  const awards = defineConsumer({
    name: "down.award",
    queue: "down.points",
    kind: "points.award.v1",
    schema,
    retry,
    timeoutMs: 4_000,
    async handle(data, { tx, envelope, attempt }) {
      if (data.reject) {
        if (attempt === 1) {
          reachedGate = true;
          await gate;
        }
        throw new PermanentError("customer closed: points refused");
      }
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "down.award", amount: data.n });
    },
  });
  // A second consumer whose only attempt fails transiently while the server
  // is down: its `exhausted` letter is due then, and cannot be written either.
  let exhaustedReached = false;
  let openExhaustedGate: () => void = () => {};
  const exhaustedGate = new Promise<void>((resolve) => {
    openExhaustedGate = resolve;
  });
  const oneShot = defineConsumer({
    name: "down.one-shot",
    queue: "down.one-shot",
    kind: "points.award.v1",
    schema,
    retry: { ...retry, maxAttempts: 1 },
    timeoutMs: 4_000,
    async handle() {
      exhaustedReached = true;
      await exhaustedGate;
      throw new Error("provider unavailable");
    },
  });

  const queue = createMemoryQueue({ concurrency: 4, visibilityTimeoutMs: 14_000 });
  const events: (DeliveryEvent & { phase: "up" | "down" | "back" })[] = [];
  let phase: "up" | "down" | "back" = "up";
  queue.onDelivery((event) => events.push({ ...event, phase }));
  queue.subscribe(bindConsumer(awards, { db, logger: silentLogger }));
  queue.subscribe(bindConsumer(oneShot, { db, logger: silentLogger }));

  try {
    const rejected = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { n: 0, reject: true } });
    const doomed = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { n: 0, reject: false } });
    const before = Array.from({ length: 10 }, (_, i) =>
      createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { n: i + 1, reject: false } }),
    );
    const during = Array.from({ length: 20 }, (_, i) =>
      createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { n: 100 + i, reject: false } }),
    );
    const rejectedId = (await queue.publish(awards.queue, rejected)).messageId;
    const doomedId = (await queue.publish(oneShot.queue, doomed)).messageId;
    for (const envelope of before) await queue.publish(awards.queue, envelope);
    await until("both failing handlers inside their work transactions", () => reachedGate && exhaustedReached);
    await until("the first jobs applied", () => events.filter((e) => e.result.outcome === "success").length >= 10);

    // Down: every session is ended, connections are refused from now on.
    await cluster().shutdown({ mode: "fast" });
    phase = "down";
    for (const envelope of during) await queue.publish(awards.queue, envelope);
    // Both handlers now fail with their dead letter due, and the database is gone.
    openGate();
    openExhaustedGate();
    await until(
      "both due letters failed to be written",
      () =>
        events.some((e) => e.messageId === rejectedId && e.phase === "down" && e.result.outcome !== "deferred") &&
        events.some((e) => e.messageId === doomedId && e.phase === "down" && e.result.outcome !== "deferred"),
    );
    // Long enough for redeliveries (visibility 14 s: above the consumers'
    // whole delivery, 2 × 4 s + 5 s) and deferrals to come and go while it is down.
    const downEvents = () => events.filter((e) => e.phase === "down").length;
    const settledAtFailure = downEvents();
    await sleep(15_000);
    const settledWhileDown = downEvents() - settledAtFailure;

    // Before the start, not after: the server takes connections before
    // start() returns, and a job applied then is not one acknowledged while down.
    phase = "back";
    await cluster().start();
    await Promise.race([
      queue.drain(),
      sleep(60_000).then(() => {
        throw new Error(`not drained 60 s after the restart: ${queue.pending()} messages pending`);
      }),
    ]);

    const context = JSON.stringify(
      events.map((e) => ({ id: e.messageId.slice(0, 8), phase: e.phase, n: e.deliveryCount, result: e.result })),
    ).slice(0, 6_000);
    // While the server was down nothing was acknowledged, and the worker went on delivering.
    const acknowledgedWhileDown = events.filter((e) => e.phase === "down" && "ack" in e.result && e.result.ack);
    expect(acknowledgedWhileDown, context).toEqual([]);
    expect(settledWhileDown, context).toBeGreaterThan(0);
    // The two letters that were due could not be written, and said so.
    for (const id of [rejectedId, doomedId]) {
      const down = events.filter((e) => e.messageId === id && e.phase === "down").map((e) => e.result.outcome);
      expect(down, context).toContain("dead_letter_failed");
    }
    // No delivery threw or hung: the harness answered every one.
    expect(
      events.filter((e) => e.result.outcome === "thrown"),
      context,
    ).toEqual([]);

    const check = postgres(cluster().url, { max: 1, onnotice: () => {} });
    try {
      const letters = await check<{ job_id: string; consumer: string; error_class: string; status: string }[]>`
        select job_id::text, consumer, error_class, status from core.dead_letters order by consumer`;
      expect(letters, context).toEqual([
        { job_id: rejected.job_id, consumer: "down.award", error_class: "permanent", status: "pending_review" },
        { job_id: doomed.job_id, consumer: "down.one-shot", error_class: "exhausted", status: "pending_review" },
      ]);
      const [exhaustedLetter] = await check<{ last_error: string }[]>`
        select last_error from core.dead_letters where consumer = 'down.one-shot'`;
      // Written by the delivery past the budget, from what this worker remembered of the failure.
      expect(exhaustedLetter?.last_error, context).toMatch(/provider unavailable/);

      const perJob = await check<{ job_id: string; effects: number; fences: number }[]>`
        select f.job_id::text, count(distinct e.ctid)::int as effects, count(distinct f.consumer)::int as fences
        from core.processed_jobs f left join test_effects e on e.job_id = f.job_id and e.consumer = f.consumer
        group by f.job_id`;
      const expected = [...before, ...during].map((e) => ({ job_id: e.job_id, effects: 1, fences: 1 }));
      const byId = (a: { job_id: string }, b: { job_id: string }) => a.job_id.localeCompare(b.job_id);
      expect(perJob.sort(byId), context).toEqual(expected.sort(byId));
      const [totals] = await check<{ effects: number }[]>`select count(*)::int as effects from test_effects`;
      expect(totals?.effects, context).toBe(before.length + during.length);
    } finally {
      await check.end({ timeout: 2 });
    }

    // The same pool answers again: the worker recovered without a restart.
    expect(await pool`select 1 as n`).toEqual([{ n: 1 }]);
  } finally {
    openGate();
    openExhaustedGate();
    await queue.close();
    await pool.end({ timeout: 2 });
  }
}, 120_000);
