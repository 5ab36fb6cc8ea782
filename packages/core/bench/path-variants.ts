/**
 * The four ways of doing one job that `pnpm bench` and `pnpm bench:path`
 * compare, on one database: each job's handler inserts one ledger row through
 * the transaction it is given.
 *   (a) harness:     bindConsumer(...).deliver() — envelope parse, schema, fence, handler, metrics;
 *   (b) handwritten: what a module developer would write with the same stack —
 *                    JSON.parse, db.transaction, the fence through Drizzle with onConflictDoNothing, the handler;
 *   (c) raw:         hand-tuned postgres.js — BEGIN pipelined with the fence insert, prepared statements;
 *   (d) raw with Drizzle's query: (c), with the ledger insert built by Drizzle's query
 *                    builder (`toSQL()`) as the handler builds it, then sent as in (c);
 *   (e) harness with a prepared query: (a), the handler's insert built once by
 *                    `preparedQuery` (README: "A hot query, built once").
 */
import { sql as drizzleSql } from "drizzle-orm";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import type postgres from "postgres";
import { z } from "zod";
import {
  bindConsumer,
  createEnvelope,
  defineConsumer,
  type Envelope,
  preparedQuery,
  processedJobs,
  type WorkTransaction,
} from "../src/index.ts";

export const CONCURRENCY = 16;

const ledger = pgTable("bench_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });
const dataSchema = z.object({ amount: z.number().int() });
type Data = z.infer<typeof dataSchema>;

/** The one handler every variant runs. */
async function credit(tx: WorkTransaction, jobId: string, data: Data) {
  await tx.insert(ledger).values({ jobId, amount: data.amount });
}

export function makeBodies(count: number): string[] {
  return Array.from({ length: count }, (_, i) =>
    JSON.stringify(createEnvelope({ tenantId: "bench", kind: "bench.credit.v1", data: { amount: i % 100 } })),
  );
}

/** Runs `work` over `items` with `CONCURRENCY` loops; returns the wall time in ms. */
export async function timed<T>(items: readonly T[], work: (item: T) => Promise<unknown>): Promise<number> {
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < items.length) {
        const item = items[next++] as T;
        await work(item);
      }
    }),
  );
  return performance.now() - started;
}

/** The consumer, its binding and the four variants over the pool `sql`. */
export function pathVariants(sql: postgres.Sql) {
  const db = drizzle({ client: sql });
  const consumer = defineConsumer({
    name: "bench.credit",
    queue: "bench.credits",
    kind: "bench.credit.v1",
    schema: dataSchema,
    handle: (data, ctx) => credit(ctx.tx, ctx.envelope.job_id, data),
  });
  const bound = bindConsumer(consumer, { db });
  const creditPrepared = preparedQuery("bench_credit", (tx) =>
    tx.insert(ledger).values({ jobId: drizzleSql.placeholder("jobId"), amount: drizzleSql.placeholder("amount") }),
  );
  const prepared = bindConsumer(
    defineConsumer({
      name: "bench.credit-prepared",
      queue: "bench.credits",
      kind: "bench.credit.v1",
      schema: dataSchema,
      async handle(data, ctx) {
        await creditPrepared(ctx.tx).execute({ jobId: ctx.envelope.job_id, amount: data.amount });
      },
    }),
    { db },
  );

  /** The raw variants' transaction; `insert` writes the ledger row. */
  async function raw(
    body: string,
    insert: (conn: postgres.ReservedSql, envelope: Envelope<Data>) => Promise<unknown>,
  ): Promise<void> {
    const envelope = JSON.parse(body) as Envelope<Data>;
    const conn = await sql.reserve();
    try {
      // BEGIN and the fence go out together; postgres.js pipelines them on the connection.
      const begin = conn`begin`.execute();
      const fence = conn`insert into core.processed_jobs (job_id, consumer) values (${envelope.job_id}, 'bench.raw')
                         on conflict do nothing returning 1`.execute();
      await begin;
      if ((await fence).length === 0) {
        await conn`commit`;
        return;
      }
      await insert(conn, envelope);
      await conn`commit`;
    } catch (error) {
      await conn`rollback`.catch(() => {});
      throw error;
    } finally {
      conn.release();
    }
  }

  const variants = {
    harness: async (body: string) => {
      const result = await bound.deliver({ body, deliveryCount: 1 });
      if (result.outcome !== "success") throw new Error(`harness: unexpected ${result.outcome}`);
    },
    harness_prepared: async (body: string) => {
      const result = await prepared.deliver({ body, deliveryCount: 1 });
      if (result.outcome !== "success") throw new Error(`harness_prepared: unexpected ${result.outcome}`);
    },
    handwritten_drizzle: async (body: string) => {
      const envelope = JSON.parse(body) as Envelope<Data>;
      await db.transaction(async (tx) => {
        const fence = await tx
          .insert(processedJobs)
          .values({ jobId: envelope.job_id, consumer: "bench.handwritten" })
          .onConflictDoNothing()
          .returning({ jobId: processedJobs.jobId });
        if (fence.length === 0) return;
        await credit(tx, envelope.job_id, envelope.data);
      });
    },
    raw_postgresjs: (body: string) =>
      raw(body, (conn, envelope) =>
        conn`insert into bench_ledger (job_id, amount) values (${envelope.job_id}, ${envelope.data.amount})`.execute(),
      ),
    raw_postgresjs_drizzle_query: (body: string) =>
      raw(body, (conn, envelope) => {
        const query = db.insert(ledger).values({ jobId: envelope.job_id, amount: envelope.data.amount }).toSQL();
        return conn.unsafe(query.sql, query.params as never[], { prepare: true });
      }),
  } as const;
  return { db, consumer, bound, variants };
}

export type Variant = keyof ReturnType<typeof pathVariants>["variants"];
