/**
 * `harness` and `harness_batched`: @softcrum/core as a module uses it.
 * `spec.concurrency` loops call `bound.deliver()` on envelopes built before
 * the clock starts (the queue is this process's memory: no transport); the
 * consumer inserts the effect through Drizzle in `tx`, in the transaction
 * that writes the fence. postgres.js pool of 10, core's migrations applied.
 *
 * The handler writes the effect with a query built once by `preparedQuery`
 * (spec.handler "prepared", the default), or with `tx.insert(...)` built by
 * Drizzle on every job ("builder").
 *
 * `harness_batched` gives the definition `batch: { maxSize, maxWaitMs: 2,
 * concurrent }` (maxSize: spec.batchSize, by default the concurrency, so the
 * deliveries in flight can share one transaction): deliveries that arrive together share one work transaction
 * (one multi-row fence insert, one COMMIT), their handlers pipelined at once
 * with no savepoints (spec.batch "concurrent", the default: the handler is
 * one insert) or one after another in a savepoint each ("sequential").
 */
import { bindConsumer, createEnvelope, defineConsumer, preparedQuery } from "@softcrum/core";
import { migrateCore } from "@softcrum/core/migrate";
import { sql as drizzleSql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import type { RunSpec, Sample } from "./config.ts";
import { effects, expectEffects, sampleOf, startMeter, withFreshDatabases } from "./measure.ts";

export const POOL_MAX = 10;
const KIND = "peers.credit.v1";
/** When spec.batchSize is not given (a spec written by hand). */
const BATCH_SIZE = 8;
const BATCH_WAIT_MS = 2;

function envelopes(count: number): string[] {
  return Array.from({ length: count }, (_, i) =>
    JSON.stringify(createEnvelope({ tenantId: "peers", kind: KIND, data: { amount: i % 100 } })),
  );
}

/** Runs `work` over `items` with `loops` concurrent loops; the wall time in ms. */
async function timed<T>(items: readonly T[], loops: number, work: (item: T) => Promise<void>): Promise<number> {
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: loops }, async () => {
      while (next < items.length) {
        const item = items[next++] as T;
        await work(item);
      }
    }),
  );
  return performance.now() - started;
}

/**
 * The warm-up and the timed run of `job` over envelope bodies queued before
 * the clock, metered, then checked for exactly one effect per job.
 */
export async function measured(spec: RunSpec, url: string, job: (body: string) => Promise<void>): Promise<Sample> {
  const warmup = envelopes(spec.warmup);
  const jobs = envelopes(spec.jobs);
  await timed(warmup, spec.concurrency, job);

  const meter = await startMeter(url);
  const ms = await timed(jobs, spec.concurrency, job);
  const costs = await meter.stop();
  await expectEffects(url, spec.jobs + spec.warmup, spec.system);
  return sampleOf(spec.system, spec.jobs, ms, costs);
}

const creditPrepared = preparedQuery("peers_credit", (tx) =>
  tx.insert(effects).values({ jobId: drizzleSql.placeholder("jobId"), amount: drizzleSql.placeholder("amount") }),
);

export function runHarness(spec: RunSpec): Promise<Sample> {
  const batched = spec.system === "harness_batched";
  const prepared = (spec.handler ?? "prepared") === "prepared";
  return withFreshDatabases(spec, [{ label: spec.system, effects: true }], async ([database]) => {
    if (!database) throw new Error("no database");
    await migrateCore(database.url);
    const sql = postgres(database.url, { max: POOL_MAX, onnotice: () => {} });
    try {
      const consumer = defineConsumer({
        name: "peers.credit",
        queue: "peers.credits",
        kind: KIND,
        schema: z.object({ amount: z.number().int() }),
        async handle(data, { tx, envelope }) {
          if (prepared) await creditPrepared(tx).execute({ jobId: envelope.job_id, amount: data.amount });
          else await tx.insert(effects).values({ jobId: envelope.job_id, amount: data.amount });
        },
        ...(batched
          ? {
              batch: {
                maxSize: spec.batchSize ?? BATCH_SIZE,
                maxWaitMs: BATCH_WAIT_MS,
                concurrent: spec.batch !== "sequential",
              },
            }
          : {}),
      });
      const bound = bindConsumer(consumer, { db: drizzle({ client: sql }) });
      const deliver = async (body: string) => {
        const result = await bound.deliver({ body, deliveryCount: 1 });
        if (result.outcome !== "success") throw new Error(`${spec.system}: outcome ${result.outcome}, not success`);
      };

      return await measured(spec, database.url, deliver);
    } finally {
      await sql.end({ timeout: 5 });
    }
  });
}
