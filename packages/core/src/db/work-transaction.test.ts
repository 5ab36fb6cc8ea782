import { useTestDatabase } from "@softcrum/testing";
import { sql as dsql } from "drizzle-orm";
import { drizzle as drizzleNodePg } from "drizzle-orm/node-postgres";
import { drizzle as drizzlePostgresJs } from "drizzle-orm/postgres-js";
import pg from "pg";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { createEffectsTable, effects } from "../../test/fixtures.ts";
import type { AnyPgDatabase } from "../consumer.ts";
import { describeError } from "../errors.ts";
import { workTransactionFor } from "./work-transaction.ts";

const db = useTestDatabase("work-transaction");
const closers: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  await createEffectsTable(db.sql);
});
beforeEach(async () => {
  await db.sql`truncate test_effects, core.processed_jobs cascade`;
});
afterAll(async () => {
  await Promise.all(closers.map((close) => close()));
});

/** The same runner semantics on both paths: postgres.js (pipelined) and any other driver (db.transaction). */
type Connect = (max: number, options?: { prepare?: boolean; withSchema?: boolean }) => AnyPgDatabase;
const drivers: [string, Connect][] = [
  [
    "postgres.js (pipelined BEGIN + fence)",
    (max, options) => {
      const client = postgres(db.url, { max, onnotice: () => {}, prepare: options?.prepare ?? true });
      closers.push(() => client.end());
      return options?.withSchema ? drizzlePostgresJs({ client, schema: { effects } }) : drizzlePostgresJs({ client });
    },
  ],
  [
    "node-postgres (Drizzle transaction)",
    (max, options) => {
      const pool = new pg.Pool({ connectionString: db.url, max });
      closers.push(() => pool.end());
      return options?.withSchema
        ? drizzleNodePg({ client: pool, schema: { effects } })
        : drizzleNodePg({ client: pool });
    },
  ],
];

const counts = async () => {
  const [row] = await db.sql<{ fences: number; effects: number }[]>`
    select (select count(*)::int from core.processed_jobs) as fences, (select count(*)::int from test_effects) as effects`;
  return row;
};

describe.each(drivers)("work transaction on %s", (_name, connect) => {
  test("runs the work and writes the fence in one commit; a second run of the same job is a duplicate", async () => {
    const run = workTransactionFor(connect(2));
    const jobId = uuidv7();
    const work = (tx: Parameters<Parameters<typeof run>[1]>[0]) =>
      tx
        .insert(effects)
        .values({ jobId, consumer: "c", amount: 1 })
        .then(() => {});
    expect(await run({ jobId, consumer: "c" }, work)).toEqual({ status: "committed" });
    expect(await run({ jobId, consumer: "c" }, work)).toEqual({ status: "duplicate" });
    expect(await run({ jobId, consumer: "other" }, work)).toEqual({ status: "committed" }); // the fence is per consumer
    expect(await counts()).toEqual({ fences: 2, effects: 2 });
  });

  test("work that throws rolls back both its writes and the fence", async () => {
    const run = workTransactionFor(connect(1));
    const jobId = uuidv7();
    await expect(
      run({ jobId, consumer: "c" }, async (tx) => {
        await tx.insert(effects).values({ jobId, consumer: "c", amount: 1 });
        throw new Error("boom");
      }),
    ).rejects.toThrow("boom");
    expect(await counts()).toEqual({ fences: 0, effects: 0 });
    // The connection is usable again afterwards (the transaction was closed).
    expect(await run({ jobId, consumer: "c" }, async () => {})).toEqual({ status: "committed" });
  });

  test("a failing statement in the work rolls back and surfaces the database error", async () => {
    const run = workTransactionFor(connect(1));
    const failure = await run({ jobId: uuidv7(), consumer: "c" }, (tx) =>
      tx.execute(dsql`select 1/0`).then(() => {}),
    ).catch((error: unknown) => error);
    expect(describeError(failure)).toMatch(/division by zero \[query: select 1\/0\]/);
    expect(await counts()).toEqual({ fences: 0, effects: 0 });
  });

  test("10 concurrent runs of one job on separate connections: exactly one runs the work", async () => {
    const jobId = uuidv7();
    let ran = 0;
    const results = await Promise.all(
      Array.from({ length: 10 }, () =>
        workTransactionFor(connect(1))({ jobId, consumer: "c" }, async (tx) => {
          ran += 1;
          await tx.execute(dsql`select pg_sleep(0.1)`);
          await tx.insert(effects).values({ jobId, consumer: "c", amount: 1 });
        }),
      ),
    );
    expect(results.filter((r) => r.status === "committed")).toHaveLength(1);
    expect(ran).toBe(1);
    expect(await counts()).toEqual({ fences: 1, effects: 1 });
  });

  test("runs with the same lock key never overlap", async () => {
    let running = 0;
    let peak = 0;
    await Promise.all(
      Array.from({ length: 5 }, () =>
        workTransactionFor(connect(1))({ jobId: uuidv7(), consumer: "c", lockKey: "c|customer-1" }, async (tx) => {
          running += 1;
          peak = Math.max(peak, running);
          await tx.execute(dsql`select pg_sleep(0.05)`);
          running -= 1;
        }),
      ),
    );
    expect(peak).toBe(1);
  });

  test("work that catches the error of a failed statement is not committed as if it succeeded", async () => {
    const run = workTransactionFor(connect(1));
    const jobId = uuidv7();
    const outcome = await run({ jobId, consumer: "c" }, async (tx) => {
      await tx.insert(effects).values({ jobId, consumer: "c", amount: 1 });
      // "insert, ignore the error": Postgres has aborted the transaction by now.
      await tx.execute(dsql`select 1/0`).catch(() => {});
    }).then(
      () => "resolved",
      () => "rejected",
    );
    expect(outcome).toBe("rejected");
    expect(await counts()).toEqual({ fences: 0, effects: 0 });
  });

  test("the relational query API (tx.query) works in the work transaction", async () => {
    const run = workTransactionFor(connect(1, { withSchema: true }));
    const jobId = uuidv7();
    let found: unknown;
    await run({ jobId, consumer: "c" }, async (tx) => {
      await tx.insert(effects).values({ jobId, consumer: "rel", amount: 4 });
      found = await (
        tx as unknown as { query: { effects: { findFirst(): Promise<unknown> } } }
      ).query.effects.findFirst();
    });
    expect(found).toEqual({ jobId, consumer: "rel", amount: 4 });
  });

  test("a nested tx.transaction() is a savepoint: its failure rolls back only its own writes", async () => {
    const run = workTransactionFor(connect(1));
    const jobId = uuidv7();
    await run({ jobId, consumer: "c" }, async (tx) => {
      await tx.insert(effects).values({ jobId, consumer: "outer", amount: 1 });
      await tx
        .transaction(async (inner) => {
          await inner.insert(effects).values({ jobId, consumer: "inner", amount: 2 });
          throw new Error("inner fails");
        })
        .catch(() => {});
      await tx.transaction(async (inner) => {
        await inner.insert(effects).values({ jobId, consumer: "inner-ok", amount: 3 });
      });
    });
    const rows = await db.sql<{ consumer: string }[]>`select consumer from test_effects order by amount`;
    expect(rows.map((r) => r.consumer)).toEqual(["outer", "inner-ok"]);
  });
});

test("a postgres.js client created with prepare: false gets no prepared statements from the harness", async () => {
  const run = workTransactionFor(drivers[0]?.[1](1, { prepare: false }) as AnyPgDatabase);
  const jobId = uuidv7();
  expect(
    await run({ jobId, consumer: "c" }, async (tx) => {
      await tx.insert(effects).values({ jobId, consumer: "c", amount: 1 });
      const [row] = (await tx.execute(dsql`select count(*)::int as n from pg_prepared_statements`)) as unknown as {
        n: number;
      }[];
      expect(row?.n).toBe(0);
    }),
  ).toEqual({ status: "committed" });
});

test("with postgres.js the fence and the handler's queries are server-prepared", async () => {
  const run = workTransactionFor(drivers[0]?.[1](1) as AnyPgDatabase);
  let statements: string[] = [];
  for (let i = 0; i < 2; i++) {
    const jobId = uuidv7();
    await run({ jobId, consumer: "c" }, async (tx) => {
      await tx.insert(effects).values({ jobId, consumer: "c", amount: 1 });
      const rows = (await tx.execute(dsql`select statement from pg_prepared_statements`)) as unknown as {
        statement: string;
      }[];
      statements = rows.map((r) => r.statement);
    });
  }
  expect(statements.some((s) => s.includes("insert into core.processed_jobs"))).toBe(true);
  expect(statements.some((s) => s.includes('insert into "test_effects"'))).toBe(true);
});
