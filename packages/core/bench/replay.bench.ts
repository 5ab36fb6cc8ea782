/**
 * Replay benchmarks of issue #10, run by `pnpm bench` (harness.bench.ts adds
 * their keys to its JSON line) or alone:
 * `pnpm --filter @softcrum/core exec tsx bench/replay.bench.ts` (last line JSON).
 *
 * - `replay_live_p99_ratio` (goal ≤ 1.5): live traffic flows through an
 *   in-process queue (a job every 5 ms; latency = publish → its delivery
 *   settled, queueing included); its p99 while 5,000 dead letters are replayed
 *   as fast as the operations can publish them (no rate limit), over its p99
 *   just before and just after (3 s each). Replays go to the consumer's replay lane (its own
 *   concurrency), so they never take the live lane's slots (#10 item 3).
 * - `replay_batch_rate_ratio` (goal 1 ± 0.05): a batch of 100,000 letters
 *   whose first REPLAY_RATE_DONE are already replayed and resolved runs its
 *   last REPLAY_RATE_LEFT at REPLAY_RATE per second; the rate it achieves over
 *   the configured one. A runner whose step re-read every replayed item
 *   (#10 item 10) fell far behind its rate this deep into a batch.
 */
import { pathToFileURL } from "node:url";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { type AnyPgDatabase, bindConsumer, createEnvelope, defineConsumer } from "../src/index.ts";
import { createOps } from "../src/ops/index.ts";

const REPLAYED = Number(process.env["BENCH_REPLAY_LETTERS"] ?? 5_000);
const BATCH_LETTERS = Number(process.env["BENCH_REPLAY_BATCH_LETTERS"] ?? 100_000);
const RATE = Number(process.env["BENCH_REPLAY_RATE"] ?? 100);
const LEFT = Number(process.env["BENCH_REPLAY_RATE_LEFT"] ?? 2_000);
const LIVE_EVERY_MS = 5;

const ledger = pgTable("bench_replay_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });

export interface ReplayBenchResult {
  readonly replay_live_p99_ratio: number;
  readonly replay_batch_rate_ratio: number;
}

const p99 = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length * 0.99)] ?? Number.NaN;

/** Inserts `count` pending letters of `consumer` with valid envelopes (UUID v7 job ids); returns their ids in order. */
async function insertLetters(sql: postgres.Sql, queue: string, consumer: string, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let start = 0; start < count; start += 5_000) {
    const n = Math.min(5_000, count - start);
    const rows = Array.from({ length: n }, () => {
      const envelope = createEnvelope({ tenantId: "bench", kind: "bench.replay.v1", data: { amount: 1 } });
      return { id: uuidv7(), jobId: envelope.job_id, payload: JSON.stringify(envelope) };
    });
    await sql`
      insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      select id, job_id, ${queue}, ${consumer}, payload, 5, 'partner down', 'exhausted'
      from unnest(${rows.map((r) => r.id)}::uuid[], ${rows.map((r) => r.jobId)}::text[], ${rows.map((r) => r.payload)}::text[])
        as t(id, job_id, payload)`;
    ids.push(...rows.map((r) => r.id));
  }
  return ids;
}

export async function replayBenchmarks(url: string): Promise<ReplayBenchResult> {
  const sql = postgres(url, { max: 16, onnotice: () => {} });
  try {
    await sql`create table if not exists bench_replay_ledger (job_id uuid not null, amount integer not null)`;
    const db = drizzle({ client: sql }) as unknown as AnyPgDatabase;
    const consumer = defineConsumer({
      name: "bench.replay-credit",
      queue: "bench.replays",
      kind: "bench.replay.v1",
      schema: z.object({ amount: z.number().int() }),
      async handle(data, { tx, envelope }) {
        await tx.insert(ledger).values({ jobId: envelope.job_id, amount: data.amount });
      },
    });

    // --- live p99 before and during an unthrottled replay of REPLAYED letters
    const queue = createMemoryQueue({ concurrency: 4, replayConcurrency: 1 });
    queue.subscribe(bindConsumer(consumer, { db }));
    const publishedAt = new Map<string, number>();
    let latencies: number[] = [];
    let replaysRun = 0;
    queue.onDelivery((event) => {
      if (event.lane === "replay") {
        if (event.result.outcome === "success") replaysRun += 1;
        return;
      }
      const t0 = publishedAt.get(event.messageId);
      if (t0 === undefined || event.result.outcome !== "success") return;
      publishedAt.delete(event.messageId);
      latencies.push(performance.now() - t0);
    });
    let liveOn = true;
    const live = (async () => {
      let next = performance.now();
      while (liveOn) {
        const t0 = performance.now();
        const envelope = createEnvelope({ tenantId: "bench", kind: "bench.replay.v1", data: { amount: 1 } });
        const { messageId } = await queue.publish(consumer.queue, envelope);
        if (messageId) publishedAt.set(messageId, t0);
        next += LIVE_EVERY_MS;
        await new Promise((r) => setTimeout(r, Math.max(0, next - performance.now())));
      }
    })();
    const letters = await insertLetters(sql, consumer.queue, consumer.name, REPLAYED);
    await sql`vacuum analyze core.dead_letters`;
    latencies = [];
    await new Promise((r) => setTimeout(r, 3_000));
    const before = latencies;
    latencies = [];
    const ops = createOps({ db, queue, approvalThreshold: Number.MAX_SAFE_INTEGER });
    const replayStarted = performance.now();
    for (const id of letters) {
      const result = await ops.deadLetters.replayOne(id, { operator: "bench", reason: "bench", batchId: null });
      if (result.outcome !== "replayed") throw new Error(`replay bench: ${result.outcome} ${result.detail ?? ""}`);
    }
    // Until the replay lane has run every replay, counted in this process:
    // polling the database for it would load the server whose latency the
    // live jobs measure (a join over the fence table every 50 ms).
    while (replaysRun < REPLAYED) await new Promise((r) => setTimeout(r, 50));
    const replayMs = performance.now() - replayStarted;
    const during = latencies;
    // The baseline is taken on both sides of the replay, so a change in the
    // machine's load (other processes) over the run weighs on both.
    latencies = [];
    await new Promise((r) => setTimeout(r, 3_000));
    before.push(...latencies);
    liveOn = false;
    await live;
    await queue.drain();
    await queue.close();
    const [fenced] = await sql<{ n: number }[]>`
      select count(*)::int as n from core.processed_jobs where consumer = ${consumer.name}
        and job_id in (select job_id::uuid from core.dead_letters where status = 'replayed')`;
    if (fenced?.n !== REPLAYED) throw new Error(`replay bench: ${fenced?.n} of ${REPLAYED} replays committed`);
    console.log(
      `replay lane: ${REPLAYED} letters replayed and run in ${Math.round(replayMs)} ms; live p99 ${p99(before).toFixed(1)} ms before (${before.length} jobs), ${p99(during).toFixed(1)} ms during (${during.length} jobs)`,
    );

    // --- a 100,000-letter batch keeps its rate deep into the batch
    await sql`truncate core.dead_letters, core.replay_batches, core.replay_batch_items, core.processed_jobs cascade`;
    const batchQueue = createMemoryQueue({ concurrency: 4, replayConcurrency: 4 });
    batchQueue.subscribe(bindConsumer(consumer, { db }));
    await insertLetters(sql, consumer.queue, consumer.name, BATCH_LETTERS);
    await sql`vacuum analyze core.dead_letters`;
    const batchOps = createOps({ db, queue: batchQueue, approvalThreshold: Number.MAX_SAFE_INTEGER });
    const batch = await batchOps.batches.create({
      operator: "bench",
      reason: "bench",
      ratePerSecond: RATE,
      batchSize: 50,
      limit: BATCH_LETTERS,
    });
    const done = BATCH_LETTERS - LEFT;
    // The first `done` letters were replayed by earlier runs, and their jobs succeeded.
    await sql`
      with first as (
        update core.replay_batch_items set state = 'replayed', replayed_at = now() - interval '1 hour', resolution = 'succeeded'
        where batch_id = ${batch.id} and position < ${done} returning dead_letter_id)
      update core.dead_letters set status = 'replayed', status_changed_at = now() - interval '1 hour',
        status_changed_by = 'bench', status_reason = 'bench', replay_batch_id = ${batch.id}
      where id in (select dead_letter_id from first)`;
    await sql`update core.replay_batches set replayed = ${done}, succeeded = ${done} where id = ${batch.id}`;
    await sql`vacuum analyze core.replay_batch_items`;
    const started = performance.now();
    const finished = await batchOps.batches.run(batch.id, { operator: "bench" });
    const ms = performance.now() - started;
    await batchQueue.drain();
    await batchQueue.close();
    if (finished.status !== "completed" || finished.replayed !== BATCH_LETTERS) {
      throw new Error(`batch bench: ${finished.status}, replayed ${finished.replayed} of ${BATCH_LETTERS}`);
    }
    // The first replay goes out one interval after the start: LEFT replays take LEFT intervals.
    const achieved = (LEFT / ms) * 1000;
    console.log(
      `replay batch: the last ${LEFT} of ${BATCH_LETTERS} letters at ${achieved.toFixed(1)}/s (configured ${RATE}/s)`,
    );
    return {
      replay_live_p99_ratio: Number((p99(during) / p99(before)).toFixed(3)),
      replay_batch_rate_ratio: Number((achieved / RATE).toFixed(3)),
    };
  } finally {
    await sql.end({ timeout: 5 });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const server = await findPostgres();
  const database = uniqueDatabaseName("softcrum_bench", "replay");
  await withAdmin(server.adminUrl, (admin) => admin`create database ${admin(database)}`);
  const url = withDatabase(server.adminUrl, database);
  try {
    await migrateCore(url);
    console.log(JSON.stringify(await replayBenchmarks(url)));
  } finally {
    await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
    await server.stop();
  }
}
