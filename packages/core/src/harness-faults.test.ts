/**
 * Issue #8: what the harness may conclude, and from what. Each test drives the
 * real harness over a real postgres.js pool against real Postgres, with the
 * fault made for real (a backend terminated by the server, a handler stuck in
 * the database or in JavaScript, two deliveries of one job racing).
 */
import { createServer } from "node:net";
import { sql as dsql } from "drizzle-orm";
import { drizzle as drizzleNodePg } from "drizzle-orm/node-postgres";
import { drizzle } from "drizzle-orm/postgres-js";
import pgDriver from "pg";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import { effects, silentLogger, testConsumers, type testJobSchema, useEffectsDatabase } from "../test/fixtures.ts";
import { latch } from "../test/latch.ts";
import { createMemoryQueue } from "./adapters/memory/index.ts";
import { createManualClock } from "./clock.ts";
import { bindConsumer, type ConsumerDefinition } from "./consumer.ts";
import { createEnvelope, type Envelope } from "./envelope.ts";
import { PermanentError } from "./errors.ts";

const pg = useEffectsDatabase("harness-faults");

const pools: postgres.Sql[] = [];
afterAll(async () => {
  await Promise.all(pools.map((p) => p.end({ timeout: 5 })));
});
/** A pool of its own, so a test controls exactly which connection a job gets. */
function pool(max: number) {
  const client = postgres(pg.url, { max, onnotice: () => {} });
  pools.push(client);
  return drizzle({ client });
}

const consumer = testConsumers("faults");
/** A consumer whose handler records one effect per run and counts its runs. */
function countingConsumer(extra: Partial<ConsumerDefinition<typeof testJobSchema>> = {}) {
  const counter = { runs: 0 };
  const definition = consumer(async (data, { tx, envelope }) => {
    counter.runs += 1;
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
  }, extra);
  return { definition, counter };
}

/**
 * Delivers `e` while another session holds its ordering key `key` (the
 * harness's lock space): the delivery must be deferred, spend no attempt and
 * not run the handler; `error` says which bound ended the wait. The key is
 * free again when this returns.
 */
async function expectDeferredWhileOrderingKeyHeld(
  c: ReturnType<typeof bindConsumer>,
  held: { readonly definition: { readonly name: string }; readonly counter: { readonly runs: number } },
  key: string,
  e: Envelope,
  error: RegExp,
) {
  const holder = await pg.sql.reserve();
  try {
    await holder`select pg_advisory_lock(hashtextextended(${`${held.definition.name}|${key}`}, 0))`;
    expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({
      outcome: "deferred",
      ack: false,
      spendsAttempt: false,
      error: expect.stringMatching(error),
    });
    expect(held.counter.runs).toBe(0);
  } finally {
    // Session-level locks outlive a released reservation: drop them first, even after a failure.
    await holder`select pg_advisory_unlock_all()`;
    holder.release();
  }
}

const job = (n = 1) => createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } });
const body = (e: Envelope) => JSON.stringify(e);

/** Effects and fences of one job. */
async function stateOf(jobId: string) {
  const [row] = await pg.sql<{ effects: number; fences: number; letters: number }[]>`
    select (select count(*)::int from test_effects where job_id = ${jobId}) as effects,
           (select count(*)::int from core.processed_jobs where job_id = ${jobId}) as fences,
           (select count(*)::int from core.dead_letters where job_id = ${jobId} and status = 'pending_review') as letters`;
  return row;
}

/** Terminates a backend and waits until it is gone. */
async function terminate(pid: number) {
  await pg.sql`select pg_terminate_backend(${pid})`;
  for (let i = 0; i < 200; i++) {
    const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from pg_stat_activity where pid = ${pid}`;
    if (row?.n === 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`backend ${pid} did not go away`);
}

async function backendPid(tx: { execute(q: unknown): Promise<unknown> }): Promise<number> {
  const rows = (await tx.execute(dsql`select pg_backend_pid() as pid`)) as unknown as { pid: number }[];
  return rows[0]?.pid as number;
}

describe("the connection's own state decides, never the handler's error (#8 item 1)", () => {
  test("a handler that throws an ECONNRESET-coded error after writing through tx leaves nothing committed, and the next job on the same connection commits only its own work", async () => {
    const db = pool(1);
    const failing = job(1);
    const next = job(2);
    const c = bindConsumer(
      consumer(async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (data.n === 1) throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
      }),
      { db, logger: silentLogger },
    );

    expect(await c.deliver({ body: body(failing), deliveryCount: 1 })).toMatchObject({ outcome: "retry" });
    expect(await c.deliver({ body: body(next), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
    expect(await stateOf(failing.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
    expect(await stateOf(next.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
    // On the last attempt too: it is dead-lettered, not acked as a duplicate of a leaked transaction.
    expect(await c.deliver({ body: body(failing), deliveryCount: 5 })).toMatchObject({
      outcome: "dead_lettered",
      errorClass: "exhausted",
    });
    expect(await stateOf(failing.job_id)).toEqual({ effects: 0, fences: 0, letters: 1 });
  });
});

describe("a success proves its commit (#8 item 2)", () => {
  test("when the server terminates the backend mid-handler, the job is not a success and nothing it wrote afterwards lands anywhere", async () => {
    const db = pool(1);
    const killed = job(1);
    let runs = 0;
    const c = bindConsumer(
      consumer(async (data, { tx, envelope }) => {
        runs += 1;
        if (runs === 1) await terminate(await backendPid(tx));
        // After the kill this would run on a reconnected session, outside any transaction.
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      }),
      { db, logger: silentLogger },
    );

    const first = await c.deliver({ body: body(killed), deliveryCount: 1 });
    expect(first.outcome).toBe("retry");
    expect(await stateOf(killed.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
    // The pool is not wedged: the retry (same one-connection pool) applies the work once.
    expect(await c.deliver({ body: body(killed), deliveryCount: 2 })).toMatchObject({ outcome: "success" });
    expect(await stateOf(killed.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
  });

  test("a handler that tries to end the transaction itself (COMMIT through tx) is refused before it is sent, never acknowledged as a success", async () => {
    const db = pool(1);
    const e = job(1);
    const c = bindConsumer(
      consumer(async (data, { tx, envelope }) => {
        await tx.execute(dsql`commit`);
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      }),
      { db, logger: silentLogger },
    );
    const result = await c.deliver({ body: body(e), deliveryCount: 1 });
    expect(result.outcome).toBe("retry");
    expect(result).toMatchObject({ error: expect.stringMatching(/COMMIT refused/) });
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
  });

  test("40 jobs over a pool of 4 whose backends are terminated mid-handler: every job ends with exactly one effect and one fence", async () => {
    const db = pool(4);
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock, concurrency: 8 });
    const killedOnce = new Set<string>();
    const c = consumer(async (data, { tx, envelope }) => {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "before", amount: data.n });
      if (data.n % 3 === 0 && !killedOnce.has(envelope.job_id)) {
        killedOnce.add(envelope.job_id);
        await terminate(await backendPid(tx));
      }
      await tx.execute(dsql`select pg_sleep(0.02)`);
    });
    queue.subscribe(bindConsumer(c, { db, logger: silentLogger }));
    const jobs = Array.from({ length: 40 }, (_, i) => job(i));
    for (const e of jobs) await queue.publish(c.queue, e);
    await queue.drain();
    await queue.close();
    expect(killedOnce.size).toBe(14);
    const [totals] = await pg.sql<{ effects: number; fences: number; orphans: number }[]>`
      select (select count(*)::int from test_effects) as effects,
             (select count(*)::int from core.processed_jobs) as fences,
             (select count(*)::int from core.processed_jobs f
               where not exists (select 1 from test_effects e where e.job_id = f.job_id)) as orphans`;
    expect(totals).toEqual({ effects: 40, fences: 40, orphans: 0 });
  });
});

describe("the dead-letter decision is serialised with the work (#8 item 3)", () => {
  /** A consumer whose handler, on attempt 5, waits for the test before finishing. */
  function gated(outcome: "commit" | "fail") {
    const inside = latch();
    const gate = latch();
    const definition = consumer(async (data, { tx, envelope, attempt }) => {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      if (attempt === 5) {
        inside.open();
        await gate.opened;
        if (outcome === "fail") throw new Error("attempt 5 failed too");
      }
    });
    return { definition, inside: inside.opened, release: gate.open };
  }

  /** Waits until some backend of the test database is blocked on a lock. */
  async function someoneWaitsOnALock() {
    for (let i = 0; i < 500; i++) {
      const [row] = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`;
      if ((row?.n ?? 0) > 0) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error("no delivery ever waited on the job's key");
  }

  test.each([
    ["commits", "commit", { effects: 1, fences: 1, letters: 0 }, "duplicate"],
    ["fails", "fail", { effects: 0, fences: 0, letters: 1 }, "dead_lettered"],
  ] as const)(
    "a past-budget delivery arriving while attempt 5 is still running waits for it: attempt 5 %s → never both a fence and a letter",
    async (_name, outcome, expected, pastBudget) => {
      const { definition, inside, release } = gated(outcome);
      const e = job(7);
      const running = bindConsumer(definition, { db: pool(1), logger: silentLogger }).deliver({
        body: body(e),
        deliveryCount: 5,
      });
      await inside;
      const late = bindConsumer(definition, { db: pool(2), logger: silentLogger }).deliver({
        body: body(e),
        deliveryCount: 6,
      });
      await someoneWaitsOnALock();
      release();
      const [fifth, sixth] = await Promise.all([running, late]);
      expect(fifth.outcome).toBe(outcome === "commit" ? "success" : "dead_lettered");
      expect(sixth.outcome).toBe(pastBudget);
      expect(await stateOf(e.job_id)).toEqual(expected);
    },
  );
  // A fence insert waiting on a dead-letter decision in flight: src/db/engine.contract.test.ts, on every driver and isolation default.
});

describe("every handler run is bounded in time (#8 item 12)", () => {
  test("a delivery whose ordering lock is held elsewhere past timeoutMs is deferred, no attempt spent, and its connection destroyed; the redelivery runs once the lock is free", async () => {
    const counting = countingConsumer({ timeoutMs: 400, orderingKey: () => "customer-1" });
    const { definition, counter } = counting;
    const c = bindConsumer(definition, { db: pool(1), logger: silentLogger });
    const e = job(12);
    await expectDeferredWhileOrderingKeyHeld(c, counting, "customer-1", e, /did not answer within 400 ms/);
    // The pool of one got a fresh connection: the destroyed one is not reused.
    const again = await c.deliver({ body: body(e), deliveryCount: 1 });
    expect(again).toMatchObject({ outcome: "success" });
    expect(counter.runs).toBe(1);
    expect(await stateOf(e.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
  });

  test("a delivery that gets no connection from the pool within timeoutMs is deferred, no attempt spent; the connection that comes later goes back to the pool", async () => {
    let runs = 0;
    const db = pool(1);
    const c = bindConsumer(
      consumer(
        async () => {
          runs += 1;
        },
        { timeoutMs: 300 },
      ),
      { db, logger: silentLogger },
    );
    const e = job(20);
    const only = await db.$client.reserve(); // the pool's one connection
    const first = c.deliver({ body: body(e), deliveryCount: 1 });
    expect(await first).toMatchObject({
      outcome: "deferred",
      spendsAttempt: false,
      error: expect.stringMatching(/no database connection within 300 ms/),
    });
    only.release(); // the harness's reservation, still queued, gets it now and gives it back
    expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
    expect(runs).toBe(1);
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 1, letters: 0 });
  });

  test("a run has one budget of timeoutMs, from asking for a connection: a slow pool and then a slow handler, each within the bound but past it together, time out (#18 item 7)", async () => {
    const db = pool(1);
    let runs = 0;
    const c = bindConsumer(
      consumer(
        async (data, { tx, envelope, signal }) => {
          runs += 1;
          await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, 1_700);
            signal.addEventListener("abort", () => {
              clearTimeout(timer);
              resolve();
            });
          });
        },
        { timeoutMs: 3_000 },
      ),
      { db, logger: silentLogger },
    );
    const e = job(21);
    const only = await db.$client.reserve();
    const run = c.deliver({ body: body(e), deliveryCount: 1 });
    await new Promise((r) => setTimeout(r, 1_700));
    only.release();
    // 1.7 s waiting for the connection, then 1.7 s in the handler: 3.4 s in
    // all, past the 3 s budget (a loaded machine only makes it longer).
    expect(await run).toMatchObject({ outcome: "retry", error: expect.stringMatching(/timeoutMs \(3000 ms\)/) });
    expect(runs).toBe(1);
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
  });

  test("on node-postgres too, a delivery whose ordering lock is held elsewhere is deferred once timeoutMs passes, no attempt spent", async () => {
    const nodePool = new pgDriver.Pool({ connectionString: pg.url, max: 1 });
    nodePool.on("error", () => {});
    const counting = countingConsumer({ timeoutMs: 300, orderingKey: () => "customer-2" });
    const { definition, counter } = counting;
    const e = job(13);
    try {
      const c = bindConsumer(definition, { db: drizzleNodePg({ client: nodePool }), logger: silentLogger });
      // The engine's own bound, as on postgres.js (the server's statement_timeout, timeoutMs + 1 s, is the backstop).
      await expectDeferredWhileOrderingKeyHeld(c, counting, "customer-2", e, /did not answer within 300 ms/);
      expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
      expect(counter.runs).toBe(1);
      expect(await stateOf(e.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
    } finally {
      await nodePool.end();
    }
  });

  test.each([
    ["stuck in pg_sleep", "sleep"],
    ["stuck in a promise that never resolves", "hang"],
  ] as const)(
    "a handler %s is aborted at timeoutMs: rolled back, retried as transient, its connection destroyed",
    async (_name, how) => {
      const db = pool(1);
      let signalled = false;
      let pidSeen = 0;
      const c = bindConsumer(
        consumer(
          async (data, { tx, envelope, signal, attempt }) => {
            await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
            if (attempt > 1) return;
            pidSeen = await backendPid(tx);
            signal.addEventListener("abort", () => {
              signalled = true;
            });
            if (how === "sleep") await tx.execute(dsql`select pg_sleep(30)`);
            else await new Promise(() => {});
          },
          { timeoutMs: 300 },
        ),
        { db, logger: silentLogger },
      );
      const e = job(3);
      const result = await c.deliver({ body: body(e), deliveryCount: 1 });
      expect(result).toMatchObject({ outcome: "retry", error: expect.stringMatching(/timeoutMs \(300 ms\)/) });
      expect(signalled).toBe(true);
      // The stuck backend goes away (server-side statement timeout / closed socket): no transaction left open.
      for (let i = 0; i < 300; i++) {
        const [row] = await pg.sql<
          { n: number }[]
        >`select count(*)::int as n from pg_stat_activity where pid = ${pidSeen}`;
        if (row?.n === 0) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      const [left] = await pg.sql<
        { n: number }[]
      >`select count(*)::int as n from pg_stat_activity where pid = ${pidSeen}`;
      expect(left?.n).toBe(0);
      expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
      // The one-connection pool still works: the retry commits once.
      expect(await c.deliver({ body: body(e), deliveryCount: 2 })).toMatchObject({ outcome: "success" });
      expect(await stateOf(e.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
    },
  );

  test("a handler that ignores the signal and writes through tx after its timeout writes nothing anywhere", async () => {
    const db = pool(1);
    let lateWrite: Promise<unknown> | undefined;
    const c = bindConsumer(
      consumer(
        async (data, { tx, envelope }) => {
          await new Promise((r) => setTimeout(r, 600));
          lateWrite = tx
            .insert(effects)
            .values({ jobId: envelope.job_id, consumer: "late", amount: data.n })
            .catch((error: unknown) => error);
          await lateWrite;
        },
        { timeoutMs: 200 },
      ),
      { db, logger: silentLogger },
    );
    const e = job(4);
    expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({ outcome: "retry" });
    await new Promise((r) => setTimeout(r, 700));
    expect(lateWrite).toBeDefined();
    expect(await lateWrite).toBeInstanceOf(Error);
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
  });

  test("defineConsumer refuses a timeoutMs that is not a positive number of milliseconds", () => {
    for (const timeoutMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => consumer(async () => {}, { timeoutMs })).toThrow(/timeoutMs must be/);
    }
  });
});

describe("review findings on the work transaction (#8 items 1, 3, 12)", () => {
  test("a handler branch that writes after another branch threw writes nothing: the run is over before ROLLBACK goes out", async () => {
    const db = pool(1);
    const e = job(5);
    let release!: () => void;
    const late = new Promise<void>((r) => {
      release = r;
    });
    let lateWrite: Promise<unknown> | undefined;
    const c = bindConsumer(
      consumer(async (data, { tx, envelope, attempt }) => {
        if (attempt > 1) {
          await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
          return;
        }
        await Promise.all([
          (async () => {
            await late;
            lateWrite = tx
              .insert(effects)
              .values({ jobId: envelope.job_id, consumer: "late", amount: data.n })
              .catch((error: unknown) => error);
          })(),
          (async () => {
            await tx.execute(dsql`select 1`);
            setTimeout(release, 0); // the other branch resumes while the harness rolls back
            throw new Error("provider answered 503");
          })(),
        ]);
      }),
      { db, logger: silentLogger },
    );
    expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({ outcome: "retry" });
    await new Promise((r) => setTimeout(r, 50));
    expect(await lateWrite).toMatchObject({ cause: { name: "WorkTransactionOverError" } });
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
    expect(await c.deliver({ body: body(e), deliveryCount: 2 })).toMatchObject({ outcome: "success" });
    expect(await stateOf(e.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
  });

  test("on node-postgres too, a handler that writes through tx after its timeout is refused and nothing lands in the next job", async () => {
    const nodePool = new pgDriver.Pool({ connectionString: pg.url, max: 1 });
    nodePool.on("error", () => {}); // an idle client the server dropped: the pool replaces it
    try {
      const db = drizzleNodePg({ client: nodePool });
      let lateWrite: Promise<unknown> | undefined;
      const c = bindConsumer(
        consumer(
          async (data, { tx, envelope }) => {
            if (data.n !== 6) {
              await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
              return;
            }
            await new Promise((r) => setTimeout(r, 600));
            lateWrite = Promise.resolve()
              .then(() => tx.insert(effects).values({ jobId: envelope.job_id, consumer: "late", amount: data.n }))
              .catch((error: unknown) => error);
          },
          { timeoutMs: 200 },
        ),
        { db, logger: silentLogger },
      );
      const slow = job(6);
      const next = job(7);
      expect(await c.deliver({ body: body(slow), deliveryCount: 1 })).toMatchObject({ outcome: "retry" });
      const nextRun = c.deliver({ body: body(next), deliveryCount: 1 });
      await new Promise((r) => setTimeout(r, 700));
      expect(await nextRun).toMatchObject({ outcome: "success" });
      expect(await lateWrite).toMatchObject({ cause: { name: "WorkTransactionOverError" } });
      expect(await stateOf(slow.job_id)).toEqual({ effects: 0, fences: 0, letters: 0 });
      expect(await stateOf(next.job_id)).toEqual({ effects: 1, fences: 1, letters: 0 });
    } finally {
      await nodePool.end();
    }
  });

  test("the work transaction bounds itself on the server too: statement and idle-in-transaction timeouts follow the handler's timeoutMs", async () => {
    let seen: unknown;
    const c = bindConsumer(
      consumer(
        async (_data, { tx }) => {
          seen = await tx.execute(
            dsql`select current_setting('statement_timeout') as st, current_setting('idle_in_transaction_session_timeout') as it`,
          );
        },
        { timeoutMs: 4321 },
      ),
      { db: pool(1), logger: silentLogger },
    );
    expect(await c.deliver({ body: body(job(8)), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
    // A second above the harness's own bound: the server is the backstop for a frozen client.
    expect(seen).toEqual([{ st: "5321ms", it: "5321ms" }]);
  });

  test("a copy of a job whose dead letter is pending does not run its handler (its outside effects would happen for a job waiting for review)", async () => {
    let runs = 0;
    const c = bindConsumer(
      consumer(async () => {
        runs += 1;
        throw new PermanentError("rejected by the partner");
      }),
      { db: pool(1), logger: silentLogger },
    );
    const e = job(9);
    expect(await c.deliver({ body: body(e), deliveryCount: 1 })).toMatchObject({ outcome: "dead_lettered" });
    const copy = await c.deliver({ body: body(e), deliveryCount: 2 });
    expect(copy).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    expect(runs).toBe(1);
    expect(await stateOf(e.job_id)).toEqual({ effects: 0, fences: 0, letters: 1 });
  });

  test("an endpoint that accepts and hangs up at once defers the delivery within its timeout, without a reconnect storm", async () => {
    let connects = 0;
    const server = createServer((socket) => {
      connects += 1;
      socket.destroy();
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const client = postgres(`postgres://postgres@127.0.0.1:${port}/none`, {
      max: 1,
      connect_timeout: 2,
      onnotice: () => {},
    });
    try {
      const c = bindConsumer(
        consumer(async () => {}, { timeoutMs: 800 }),
        { db: drizzle({ client }), logger: silentLogger },
      );
      const result = await c.deliver({ body: body(job(10)), deliveryCount: 1 });
      expect(result).toMatchObject({ outcome: "deferred", spendsAttempt: false });
      await new Promise((r) => setTimeout(r, 500));
      expect(connects).toBeLessThan(30);
    } finally {
      await client.end({ timeout: 0 }).catch(() => {});
      await new Promise((r) => server.close(r));
    }
  });
});
