/**
 * Fan-out at scale (#20 goal): one tick over FANOUT_TENANTS tenants (default
 * 100,000), run twice at once, through the in-process adapter and the
 * harness on real Postgres. Reports:
 * - `fanout_effects`: the jobs' effects; goal: exactly one per tenant (the
 *   second run's copies are duplicates the fence absorbs);
 * - `fanout_rss_growth_mb`: resident memory at the end over before the runs,
 *   after a full GC; goal < 50 (tenants are read in pages and published with
 *   bounded concurrency; the queue is kept from piling up by waiting for
 *   deliveries when 2,000 are in flight).
 * The tenant source makes each page's ids from `after`, as a keyset query would.
 * The last line printed is JSON.
 *
 *   pnpm --filter @softcrum/core bench:fanout          (FANOUT_TENANTS=10000 for a short run)
 */
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { pgTable, text, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { bindConsumer, defineConsumer, fanOut, type QueuePort } from "../src/index.ts";
import { gc, settledRss } from "./memory.ts";

const TENANTS = Number(process.env["FANOUT_TENANTS"] ?? 100_000);
const IN_FLIGHT = 2_000;

const snapshots = pgTable("fanout_snapshots", {
  jobId: uuid("job_id").notNull(),
  tenantId: text("tenant_id").notNull(),
});
const idOf = (i: number) => `t-${String(i).padStart(7, "0")}`;

const server = await findPostgres();
const database = uniqueDatabaseName("softcrum_bench", "fanout");
await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(database)}`);
const url = withDatabase(server.adminUrl, database);
let result: Record<string, number> | undefined;
try {
  await migrateCore(url);
  const sql = postgres(url, { max: 16, onnotice: () => {} });
  await sql`create table fanout_snapshots (job_id uuid not null, tenant_id text not null)`;
  const consumer = defineConsumer({
    name: "fanout.snapshot",
    queue: "fanout.snapshots",
    kind: "tenant.snapshot.v1",
    schema: z.object({ tick: z.string() }),
    async handle(_data, { tx, envelope }) {
      await tx.insert(snapshots).values({ jobId: envelope.job_id, tenantId: envelope.tenant_id });
    },
  });
  const memory = createMemoryQueue({ concurrency: 16 });
  let settled = 0;
  const waiters: (() => void)[] = [];
  memory.onDelivery((event) => {
    if ("ack" in event.result && event.result.ack) settled += 1;
    if (waiters.length > 0) for (const wake of waiters.splice(0)) wake();
  });
  memory.subscribe(bindConsumer(consumer, { db: drizzle({ client: sql }) }));
  let published = 0;
  // Backpressure: the bench measures the fan-out, not an in-memory queue holding 200,000 messages.
  const queue: QueuePort = {
    async publish(name, envelope, opts) {
      while (published - settled >= IN_FLIGHT) await new Promise<void>((wake) => waiters.push(wake));
      published += 1;
      return memory.publish(name, envelope, opts);
    },
    schedule: (name, envelope, at) => memory.schedule(name, envelope, at),
  };
  const tenants = async ({ after, limit }: { after: string | null; limit: number }) => {
    const start = after === null ? 0 : Number(after.slice(2)) + 1;
    const end = Math.min(TENANTS, start + limit);
    return Array.from({ length: Math.max(0, end - start) }, (_, k) => idOf(start + k));
  };
  const tick = new Date(Math.floor(Date.now() / 1_800_000) * 1_800_000);
  const baseline = await settledRss();
  const started = performance.now();
  const run = () => fanOut({ queue, queueName: consumer.queue, kind: "tenant.snapshot.v1", tick, tenants });
  const reports = await Promise.all([run(), run()]);
  await memory.drain();
  const seconds = (performance.now() - started) / 1000;
  const end = await settledRss();
  await memory.close();
  await sql.end({ timeout: 5 });
  const [row] = await withAdmin(
    url,
    (admin) => admin<{ effects: number; tenants: number }[]>`
      select count(*)::int as effects, count(distinct tenant_id)::int as tenants from fanout_snapshots`,
  );
  console.log(
    `fanout: ${TENANTS} tenants × 2 runs of one tick in ${seconds.toFixed(1)} s; published ${reports.map((r) => r.published).join(" + ")}; effects ${row?.effects} over ${row?.tenants} tenants; rss ${Math.round(baseline / 2 ** 20)} → ${Math.round(end / 2 ** 20)} MiB${gc ? "" : " (no --expose-gc: not settled)"}`,
  );
  result = {
    fanout_tenants: TENANTS,
    fanout_published: reports.reduce((n, r) => n + r.published, 0),
    fanout_effects: row?.effects ?? -1,
    fanout_rss_growth_mb: Number(((end - baseline) / 2 ** 20).toFixed(1)),
    fanout_seconds: Number(seconds.toFixed(1)),
  };
} finally {
  await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
  await server.stop();
}
console.log(JSON.stringify(result));
