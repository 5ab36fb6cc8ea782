/**
 * `preparedQuery` (#23 item 2): a handler's hot query built once and bound to
 * each job's work transaction — on every driver, its statements are the
 * job's: committed with the fence, undone with the job, refused once the run
 * is over, never run on another connection.
 */
import { and, eq, sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { describe, expect, test } from "vitest";
import { useDriverMatrix } from "../../test/drivers.ts";
import { effects, silentLogger, testConsumers } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope, type Envelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import type { BoundConsumer } from "../queue-port.ts";
import { WorkTransactionOverError } from "./errors.ts";
import { preparedQuery } from "./prepared-query.ts";
import { processedJobs } from "./schema.ts";
import type { WorkTransaction } from "./types.ts";

const matrix = useDriverMatrix("prepared-query", {
  drivers: ["postgres.js", "postgres.js unpatched", "node-postgres", "PGlite"],
  isolations: ["read committed"],
});
const consumer = testConsumers("prepared");
const job = (n: number) => createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } });
const deliver = (bound: BoundConsumer, envelope: Envelope) =>
  bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 1 });

/** The effect insert, built once; `builds` counts how often `build` ran. */
function creditQuery(name = "prepared_credit") {
  const counter = { builds: 0 };
  const bind = preparedQuery(name, (tx) => {
    counter.builds += 1;
    return tx.insert(effects).values({
      jobId: sql.placeholder("jobId"),
      consumer: sql.placeholder("consumer"),
      amount: sql.placeholder("amount"),
    });
  });
  return { bind, counter };
}

describe.each(matrix)("on %s", (c) => {
  test("built once, each job's copy writes in that job's work transaction: its row commits with the fence, in the same transaction", async () => {
    const { bind, counter } = creditQuery();
    const definition = consumer(async (data, { tx, envelope }) => {
      await bind(tx).execute({ jobId: envelope.job_id, consumer: "c", amount: data.n });
    });
    const bound = bindConsumer(definition, { db: c.db(3), logger: silentLogger });
    const envelopes = Array.from({ length: 9 }, (_, i) => job(i + 1));
    // Three at a time: the copies of concurrent jobs are bound to different connections.
    for (let i = 0; i < envelopes.length; i += 3) {
      const outcomes = await Promise.all(envelopes.slice(i, i + 3).map((e) => deliver(bound, e)));
      expect(outcomes.map((o) => o.outcome)).toEqual(["success", "success", "success"]);
    }
    expect(counter.builds).toBe(1);
    const rows = await c.rows<{ amount: number; same: boolean }>(
      `select e.amount, e.xmin::text = f.xmin::text as same
         from test_effects e join core.processed_jobs f on f.job_id = e.job_id order by e.amount`,
    );
    expect(rows).toEqual(envelopes.map((_, i) => ({ amount: i + 1, same: true })));
  });

  test("a prepared select maps its rows on every job's copy, and reads the job's own uncommitted write", async () => {
    const { bind } = creditQuery();
    const read = preparedQuery("prepared_read", (tx) =>
      tx
        .select({ amount: effects.amount, consumer: effects.consumer })
        .from(effects)
        .where(eq(effects.jobId, sql.placeholder("jobId"))),
    );
    const seen: unknown[] = [];
    const definition = consumer(async (data, { tx, envelope }) => {
      await bind(tx).execute({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      seen.push(await read(tx).execute({ jobId: envelope.job_id }));
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    for (const n of [4, 5, 6]) expect((await deliver(bound, job(n))).outcome).toBe("success");
    expect(seen).toEqual([4, 5, 6].map((amount) => [{ amount, consumer: "c" }]));
  });

  test("a handler that throws after the query leaves neither its row nor a fence; the retry writes it once", async () => {
    const { bind } = creditQuery();
    let failures = 1;
    const definition = consumer(async (data, { tx, envelope }) => {
      await bind(tx).execute({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      if (failures-- > 0) throw new Error("after the insert");
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const envelope = job(7);
    expect((await deliver(bound, envelope)).outcome).toBe("retry");
    expect(await c.rows("select 1 from test_effects union all select 1 from core.processed_jobs")).toEqual([]);
    expect((await deliver(bound, envelope)).outcome).toBe("success");
    expect((await deliver(bound, envelope)).outcome).toBe("duplicate");
    expect(await c.rows("select amount from test_effects")).toEqual([{ amount: 7 }]);
  });

  test("a copy kept past its run is refused by the job's gate, and writes nothing", async () => {
    const { bind } = creditQuery();
    let kept: ReturnType<typeof bind> | undefined;
    const definition = consumer(async (_data, { tx }) => {
      kept = bind(tx);
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const envelope = job(1);
    expect((await deliver(bound, envelope)).outcome).toBe("success");
    // Drizzle wraps what the client threw in its DrizzleQueryError.
    const refused = await kept?.execute({ jobId: envelope.job_id, consumer: "late", amount: 1 }).catch((e: Error) => e);
    expect((refused as Error | undefined)?.cause).toBeInstanceOf(WorkTransactionOverError);
    expect(await c.rows("select 1 from test_effects")).toEqual([]);
  });

  test("bound to a savepoint of tx, it is undone with the savepoint and the job goes on", async () => {
    const { bind } = creditQuery();
    const definition = consumer(async (data, { tx, envelope }) => {
      await tx
        .transaction(async (savepoint) => {
          await bind(savepoint).execute({ jobId: envelope.job_id, consumer: "undone", amount: data.n });
          throw new Error("undo the savepoint");
        })
        .catch(() => {});
      await bind(tx).execute({ jobId: envelope.job_id, consumer: "kept", amount: data.n });
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    expect((await deliver(bound, job(3))).outcome).toBe("success");
    expect(await c.rows("select consumer from test_effects")).toEqual([{ consumer: "kept" }]);
  });

  test.each([
    ["sequential", false],
    ["concurrent", true],
  ])("in a %s batch, a job that fails after its query is undone alone", async (_, concurrent) => {
    const { bind, counter } = creditQuery();
    const definition = consumer(
      async (data, { tx, envelope }) => {
        await bind(tx).execute({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (data.n === 2) throw new Error("job 2 fails");
      },
      { batch: { maxSize: 4, maxWaitMs: 30, concurrent } },
    );
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const outcomes = await Promise.all([1, 2, 3, 4].map((n) => deliver(bound, job(n))));
    expect(outcomes.map((o) => o.outcome)).toEqual(["success", "retry", "success", "success"]);
    expect(await c.rows("select amount from test_effects order by amount")).toEqual([
      { amount: 1 },
      { amount: 3 },
      { amount: 4 },
    ]);
    expect(counter.builds).toBe(1);
  });

  test("bound to the database, or to a transaction of its own, it is refused before anything runs", async () => {
    const { bind, counter } = creditQuery();
    const db = c.db(1);
    expect(() => bind(db as unknown as WorkTransaction)).toThrow(InvalidConfigError);
    await db.transaction(async (own) => {
      expect(() => bind(own as unknown as WorkTransaction)).toThrow(/handler's tx/);
    });
    expect(counter.builds).toBe(0);
  });
});

describe("bad input", () => {
  test("a name that is not a Postgres identifier, or a build that is not a function, is an InvalidConfigError", () => {
    const build = (tx: WorkTransaction) => tx.select().from(effects);
    for (const name of ["", "1st", "has space", "x".repeat(64), 7 as unknown as string]) {
      expect(() => preparedQuery(name, build)).toThrow(InvalidConfigError);
    }
    expect(() => preparedQuery("ok", "select 1" as never)).toThrow(/build must be a function/);
  });
});

describe("on postgres.js", () => {
  const [server] = useDriverMatrix("prepared-query-pooler", {
    drivers: ["postgres.js"],
    isolations: ["read committed"],
  });
  const prepared = (tx: WorkTransaction) =>
    tx.execute(
      sql`select count(*)::int as n from pg_prepared_statements where statement like 'insert into "test_effects"%'`,
    );

  test("the copies are server-prepared exactly when the client prepares its other queries (never behind a pooler that cannot take them)", async () => {
    if (!server) throw new Error("no server case");
    for (const prepare of [true, false]) {
      const client = postgres(server.url, { max: 1, prepare, onnotice: () => {} });
      try {
        const { bind } = creditQuery(`prepared_credit_${prepare}`);
        const seen: unknown[] = [];
        const definition = consumer(async (data, { tx, envelope }) => {
          await bind(tx).execute({ jobId: envelope.job_id, consumer: String(prepare), amount: data.n });
          seen.push(((await prepared(tx)) as unknown as { n: number }[])[0]?.n);
        });
        const bound = bindConsumer(definition, { db: drizzle({ client }), logger: silentLogger });
        for (const n of [1, 2]) expect((await deliver(bound, job(n))).outcome).toBe("success");
        expect(seen).toEqual(prepare ? [1, 1] : [0, 0]);
      } finally {
        await client.end({ timeout: 5 });
      }
    }
  });
});

describe("a query that would not run on the job's tx", () => {
  const [server] = useDriverMatrix("prepared-query-elsewhere", {
    drivers: ["postgres.js"],
    isolations: ["read committed"],
  });

  test("built on db by a build that ignores its tx, or a builder whose prepared query keeps no client: InvalidConfigError before anything runs, nothing written", async () => {
    if (!server) throw new Error("no server case");
    const db = server.db(2);
    const onDb = preparedQuery("prepared_on_db", () =>
      db.insert(effects).values({ jobId: sql.placeholder("jobId"), consumer: "db", amount: 1 }),
    );
    const opaque = preparedQuery("prepared_opaque", (tx) => ({
      prepare: () => ({ run: (jobId: string) => tx.insert(effects).values({ jobId, consumer: "opaque", amount: 2 }) }),
    }));
    const errors: unknown[] = [];
    const definition = consumer(async (data, { tx, envelope }) => {
      try {
        if (data.n === 1) await onDb(tx).execute({ jobId: envelope.job_id });
        else await opaque(tx).run(envelope.job_id);
      } catch (error) {
        errors.push(error);
        throw error;
      }
    });
    const bound = bindConsumer(definition, { db, logger: silentLogger });
    for (const n of [1, 2, 1, 2]) expect((await deliver(bound, job(n))).outcome).toBe("retry");
    expect(errors).toHaveLength(4);
    for (const error of errors) {
      expect(error).toBeInstanceOf(InvalidConfigError);
      expect(String(error)).toMatch(/does not run on the tx it was given/);
    }
    expect(await server.rows("select 1 from test_effects")).toEqual([]);
  });

  test("update, delete, a join and a relational query work on copies, each reading its own job's rows", async () => {
    if (!server) throw new Error("no server case");
    const client = postgres(server.url, { max: 2, onnotice: () => {} });
    try {
      const db = drizzle({ client, schema: { effects } });
      const { bind } = creditQuery("prepared_rel_credit");
      const raise = preparedQuery("prepared_raise", (tx) =>
        tx
          .update(effects)
          .set({ amount: sql`${effects.amount} * 10` })
          .where(eq(effects.jobId, sql.placeholder("jobId"))),
      );
      const joined = preparedQuery("prepared_join", (tx) =>
        tx
          .select({ amount: effects.amount, fenced: processedJobs.jobId })
          .from(effects)
          .innerJoin(processedJobs, eq(processedJobs.jobId, effects.jobId))
          .where(eq(effects.jobId, sql.placeholder("jobId"))),
      );
      const related = preparedQuery("prepared_related", (tx) =>
        (tx as unknown as typeof db).query.effects.findMany({
          where: (e, { eq: equals }) => equals(e.jobId, sql.placeholder("jobId")),
          columns: { amount: true },
        }),
      );
      const drop = preparedQuery("prepared_drop", (tx) =>
        tx.delete(effects).where(and(eq(effects.jobId, sql.placeholder("jobId")), eq(effects.consumer, "gone"))),
      );
      const seen: unknown[] = [];
      const definition = consumer(async (data, { tx, envelope }) => {
        const jobId = envelope.job_id;
        await bind(tx).execute({ jobId, consumer: "c", amount: data.n });
        await bind(tx).execute({ jobId, consumer: "gone", amount: data.n });
        await raise(tx).execute({ jobId });
        await drop(tx).execute({ jobId });
        const rows = await joined(tx).execute({ jobId });
        seen.push([
          rows.map((r) => ({ amount: r.amount, fenced: r.fenced === jobId })),
          await related(tx).execute({ jobId }),
        ]);
      });
      const bound = bindConsumer(definition, { db, logger: silentLogger });
      const outcomes = await Promise.all([1, 2, 3].map((n) => deliver(bound, job(n))));
      expect(outcomes.map((o) => o.outcome)).toEqual(["success", "success", "success"]);
      expect(seen).toHaveLength(3);
      expect(new Set(seen.map((s) => JSON.stringify(s)))).toEqual(
        new Set([10, 20, 30].map((amount) => JSON.stringify([[{ amount, fenced: true }], [{ amount }]]))),
      );
      expect(await server.rows("select amount from test_effects order by amount")).toEqual([
        { amount: 10 },
        { amount: 20 },
        { amount: 30 },
      ]);
    } finally {
      await client.end({ timeout: 5 });
    }
  });
});

describe("on node-postgres", () => {
  const [server] = useDriverMatrix("prepared-query-names", {
    drivers: ["node-postgres"],
    isolations: ["read committed"],
  });

  test("no named statement is left on the server connection (a transaction-mode pooler keeps none), and two queries may share a name", async () => {
    if (!server) throw new Error("no server case");
    const first = preparedQuery("prepared_shared", (tx) =>
      tx.insert(effects).values({ jobId: sql.placeholder("jobId"), consumer: "first", amount: 1 }),
    );
    const second = preparedQuery("prepared_shared", (tx) =>
      tx
        .insert(effects)
        .values({ jobId: sql.placeholder("jobId"), consumer: "second", amount: 2 })
        .onConflictDoNothing(),
    );
    const named: unknown[] = [];
    const definition = consumer(async (_data, { tx, envelope }) => {
      await first(tx).execute({ jobId: envelope.job_id });
      await second(tx).execute({ jobId: envelope.job_id });
      named.push(
        (
          (await tx.execute(sql`select count(*)::int as n from pg_prepared_statements`)) as unknown as {
            rows: { n: number }[];
          }
        ).rows[0]?.n,
      );
    });
    const bound = bindConsumer(definition, { db: server.db(1), logger: silentLogger });
    for (const n of [1, 2]) expect((await deliver(bound, job(n))).outcome).toBe("success");
    expect(named).toEqual([0, 0]);
    expect(await server.rows("select consumer from test_effects order by consumer")).toEqual([
      { consumer: "first" },
      { consumer: "first" },
      { consumer: "second" },
      { consumer: "second" },
    ]);
  });
});
