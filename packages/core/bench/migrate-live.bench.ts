/**
 * `pnpm --filter @softcrum/core bench:deploy` (#18 item 6): a deploy never
 * stalls live work. A database one release behind (the core migrations up to
 * 0012) holding 1,000,000 fences and 100,000 pending letters; 4 long jobs
 * (4 s handlers) always in flight and 12 loops of short jobs through the
 * harness; then `migrateCore` applies the rest. Reports the short jobs' p99
 * before and during the migration, and their ratio: a ratio against the same
 * run, not a timed assertion. The last line printed is JSON.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { coreMigrations, migrateCore, migratePostgres } from "../src/db/migrate.ts";
import { bindConsumer, createEnvelope, defineConsumer } from "../src/index.ts";

const FENCES = Number(process.env["BENCH_DEPLOY_FENCES"] ?? 1_000_000);
const LETTERS = Number(process.env["BENCH_DEPLOY_LETTERS"] ?? 100_000);
const BEHIND = "0012_pending_letter";
const LONG_JOBS = 4;
const LIVE_LOOPS = 12;
const LONG_MS = 4_000;

const ledger = pgTable("bench_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });

/** The core migrations up to and including `last`, as a folder of their own. */
function migrationsUpTo(last: string): string {
  const folder = mkdtempSync(join(tmpdir(), "softcrum-deploy-bench-"));
  cpSync(coreMigrations.migrationsFolder, folder, { recursive: true });
  const journalPath = join(folder, "meta", "_journal.json");
  const journal = JSON.parse(readFileSync(journalPath, "utf8")) as { entries: { tag: string }[] };
  const end = journal.entries.findIndex((e) => e.tag === last);
  if (end < 0) throw new Error(`no migration ${last}`);
  writeFileSync(journalPath, JSON.stringify({ ...journal, entries: journal.entries.slice(0, end + 1) }));
  return folder;
}

const p99 = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length * 0.99)] ?? Number.NaN;

const server = await findPostgres();
const database = uniqueDatabaseName("softcrum_bench", "deploy");
await withAdmin(server.adminUrl, (admin) => admin`create database ${admin(database)}`);
const url = withDatabase(server.adminUrl, database);
const sql = postgres(url, { max: LONG_JOBS + LIVE_LOOPS + 2, onnotice: () => {} });
const behind = migrationsUpTo(BEHIND);
try {
  await migratePostgres(url, { ...coreMigrations, migrationsFolder: behind });
  await sql`create table bench_ledger (job_id uuid not null, amount integer not null)`;
  await sql`insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'bench.deploy', now() - random() * interval '7 days' from generate_series(1, ${FENCES})`;
  await sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    select gen_random_uuid(), gen_random_uuid()::text, 'bench.q', 'bench.deploy', '{}', 5, 'e', 'exhausted'
    from generate_series(1, ${LETTERS})`;
  await sql`vacuum analyze core.processed_jobs, core.dead_letters`;

  const db = drizzle({ client: sql });
  const consumer = defineConsumer({
    name: "bench.deploy",
    queue: "bench.deploy",
    kind: "bench.deploy.v1",
    schema: z.object({ amount: z.number().int(), long: z.boolean() }),
    timeoutMs: 10_000,
    async handle(data, { tx, envelope }) {
      await tx.insert(ledger).values({ jobId: envelope.job_id, amount: data.amount });
      if (data.long) await new Promise((r) => setTimeout(r, LONG_MS));
    },
  });
  const bound = bindConsumer(consumer, { db });
  const deliver = async (long: boolean) => {
    const body = JSON.stringify(
      createEnvelope({ tenantId: "bench", kind: "bench.deploy.v1", data: { amount: 1, long } }),
    );
    const result = await bound.deliver({ body, deliveryCount: 1 });
    if (result.outcome !== "success") throw new Error(`unexpected ${result.outcome}`);
  };

  const live = { latencies: [] as number[], stop: false };
  const loops = [
    ...Array.from({ length: LONG_JOBS }, async () => {
      while (!live.stop) await deliver(true);
    }),
    ...Array.from({ length: LIVE_LOOPS }, async () => {
      while (!live.stop) {
        const started = performance.now();
        await deliver(false);
        live.latencies.push(performance.now() - started);
      }
    }),
  ];
  await new Promise((r) => setTimeout(r, 3_000));
  const before = live.latencies.splice(0);
  const started = performance.now();
  const report = await migrateCore(url);
  const migrateMs = performance.now() - started;
  // The long jobs in flight when the migration ended finish too: what they held is measured.
  await new Promise((r) => setTimeout(r, 500));
  const during = live.latencies.splice(0);
  live.stop = true;
  await Promise.all(loops);
  const result = {
    deploy_fences: FENCES,
    deploy_letters: LETTERS,
    deploy_applied: report.applied,
    deploy_migrate_ms: Math.round(migrateMs),
    deploy_live_jobs_before: before.length,
    deploy_live_jobs_during: during.length,
    deploy_live_p99_ms_before: Number(p99(before).toFixed(1)),
    deploy_live_p99_ms_during: Number(p99(during).toFixed(1)),
    deploy_live_p99_ratio: Number((p99(during) / p99(before)).toFixed(3)),
  };
  console.log(JSON.stringify(result));
} finally {
  rmSync(behind, { recursive: true, force: true });
  await sql.end({ timeout: 5 });
  await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
  await server.stop();
}
