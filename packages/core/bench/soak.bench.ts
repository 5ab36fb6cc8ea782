/**
 * The soak (issue #12 item 4): SOAK_JOBS jobs (default 1,000,000) through the
 * in-process adapter and the harness on real Postgres, in a process of its
 * own (harness.bench.ts runs it as a child, so nothing else in the process
 * holds memory or handles). Reports:
 * - `soak_rss_growth_pct`: resident memory once the whole run is done over
 *   the resident memory after the warm-up (the first SOAK_WARMUP jobs), both
 *   measured after a full GC; goal < 10;
 * - `soak_open_handles`: the resources (sockets, timers, ...) still active
 *   after `queue.close()` and the pool's `end()`, beyond those the process had
 *   before the soak started; goal 0.
 * Jobs go in waves (publish SOAK_WAVE, drain), so the adapter's backlog stays
 * bounded and memory reflects what the harness and adapter keep, not the
 * backlog. The last line printed is JSON.
 *
 *   SOAK_JOBS=20000 pnpm --filter @softcrum/core exec tsx --expose-gc bench/soak.bench.ts
 */
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { bindConsumer, createEnvelope, defineConsumer } from "../src/index.ts";
import { gc, settledRss } from "./memory.ts";

const JOBS = Number(process.env["SOAK_JOBS"] ?? 1_000_000);
const WAVE = Number(process.env["SOAK_WAVE"] ?? 10_000);
const WARMUP = Math.min(Number(process.env["SOAK_WARMUP"] ?? 50_000), Math.floor(JOBS / 5));
const CONCURRENCY = 16;

/** Active resources by type (`process.getActiveResourcesInfo`), e.g. { TCPSocketWrap: 2, Timeout: 1 }. */
function resources(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const type of process.getActiveResourcesInfo()) counts.set(type, (counts.get(type) ?? 0) + 1);
  return counts;
}

const ledger = pgTable("soak_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });

const before = resources();
const server = await findPostgres();
const database = uniqueDatabaseName("softcrum_bench", "soak");
await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(database)}`);
const url = withDatabase(server.adminUrl, database);
let result: Record<string, number> | undefined;
try {
  await migrateCore(url);
  const sql = postgres(url, { max: CONCURRENCY, onnotice: () => {} });
  await sql`create table soak_ledger (job_id uuid not null, amount integer not null)`;
  const consumer = defineConsumer({
    name: "soak.credit",
    queue: "soak.credits",
    kind: "soak.credit.v1",
    schema: z.object({ amount: z.number().int() }),
    async handle(data, { tx, envelope }) {
      await tx.insert(ledger).values({ jobId: envelope.job_id, amount: data.amount });
    },
  });
  const queue = createMemoryQueue({ concurrency: CONCURRENCY });
  const outcomes = new Map<string, number>();
  queue.onDelivery((event) => outcomes.set(event.result.outcome, (outcomes.get(event.result.outcome) ?? 0) + 1));
  queue.subscribe(bindConsumer(consumer, { db: drizzle({ client: sql }) }));

  let baseline = 0;
  let peak = 0;
  const started = performance.now();
  let warmedAt = started;
  for (let sent = 0; sent < JOBS; ) {
    const wave = Math.min(WAVE, JOBS - sent);
    for (let i = 0; i < wave; i++) {
      await queue.publish(
        consumer.queue,
        createEnvelope({ tenantId: "soak", kind: "soak.credit.v1", data: { amount: (sent + i) % 100 } }),
      );
    }
    await queue.drain();
    const before = sent;
    sent += wave;
    if (before < WARMUP && sent >= WARMUP) {
      baseline = await settledRss();
      warmedAt = performance.now();
    }
    peak = Math.max(peak, process.memoryUsage().rss);
    if (sent % 100_000 === 0 || sent === JOBS) {
      const rate = Math.round(sent / ((performance.now() - started) / 1000));
      process.stdout.write(`soak: ${sent}/${JOBS} jobs, ${rate} jobs/s, rss ${Math.round(peak / 2 ** 20)} MiB\n`);
    }
  }
  const steadyMs = performance.now() - warmedAt;
  const end = await settledRss();
  await queue.close();
  await sql.end({ timeout: 5 });
  const [row] = await withAdmin(
    withDatabase(server.adminUrl, database),
    (admin) => admin<{ n: number }[]>`select count(*)::int as n from soak_ledger`,
  );
  if (row?.n !== JOBS || outcomes.get("success") !== JOBS) {
    throw new Error(`soak: ${row?.n} ledger rows and ${outcomes.get("success")} successes for ${JOBS} jobs`);
  }
  // What close() left behind: resources beyond those of the process before the soak.
  await new Promise((resolve) => setTimeout(resolve, 100));
  let open = 0;
  const left: string[] = [];
  for (const [type, n] of resources()) {
    const extra = n - (before.get(type) ?? 0);
    if (extra > 0) {
      open += extra;
      left.push(`${type} ×${extra}`);
    }
  }
  console.log(
    `soak: ${JOBS} jobs, ${Math.round(((JOBS - WARMUP) / steadyMs) * 1000)} jobs/s after the warm-up; rss ${Math.round(baseline / 2 ** 20)} MiB after ${WARMUP} jobs, ${Math.round(end / 2 ** 20)} MiB at the end (peak ${Math.round(peak / 2 ** 20)} MiB${gc ? "" : ", no --expose-gc: not settled"}); open after close: ${left.join(", ") || "none"}`,
  );
  result = {
    soak_jobs: JOBS,
    soak_rss_growth_pct: Number((((end - baseline) / baseline) * 100).toFixed(2)),
    soak_open_handles: open,
  };
} finally {
  await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
  await server.stop();
}
console.log(JSON.stringify(result));
