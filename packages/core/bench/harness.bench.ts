/**
 * `pnpm bench`: the harness against doing the same work by hand, on real
 * Postgres, in one process, interleaved so that all five see the same
 * machine state. Each job's handler inserts one ledger row through the
 * transaction it is given. Concurrency 16.
 * The variants are bench/path-variants.ts's: (a) the harness, (b) handwritten
 * Drizzle, (c) raw postgres.js, (d) raw postgres.js with Drizzle's query, (e)
 * the harness with its handler's query built once (`preparedQuery`).
 * Then the harness's jobs are delivered again (all duplicates), and the TTL
 * cleanup deletes 1,000,000 expired fence rows while 16 consumers keep going,
 * and the replay benchmarks of bench/replay.bench.ts run. Last, the child
 * benchmarks of bench/child-bench.ts, each in a process of its own: rate
 * limits (limits.bench.ts), fan-out (fanout.bench.ts) and the soak
 * (soak.bench.ts, SOAK_JOBS jobs); their keys join the JSON.
 * The last line printed is JSON (see README).
 */
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { createEnvelope } from "../src/index.ts";
import { createFenceCleanup } from "../src/maintenance/fence-cleanup.ts";
import { benchDatabase } from "./bench-database.ts";
import { runChildBenches } from "./child-bench.ts";
import { CONCURRENCY, makeBodies, pathVariants, timed, type Variant } from "./path-variants.ts";
import { replayBenchmarks } from "./replay.bench.ts";

const JOBS = Number(process.env["BENCH_JOBS"] ?? 20_000);
const ROUNDS = 10;
const WARMUP = 500;
const CLEANUP_ROWS = Number(process.env["BENCH_CLEANUP_ROWS"] ?? 1_000_000);

const bench = await benchDatabase("harness", CONCURRENCY);
const { server, url, sql } = bench;
try {
  const { consumer, bound, variants } = pathVariants(sql);
  const names = Object.keys(variants) as Variant[];

  // Warm up connections, prepared statements and the JIT, off the clock.
  for (const name of names) await timed(makeBodies(WARMUP), variants[name]);

  const bodies = Object.fromEntries(names.map((n) => [n, makeBodies(JOBS)])) as Record<Variant, string[]>;
  const elapsed = Object.fromEntries(names.map((n) => [n, 0])) as Record<Variant, number>;
  const perRound = Math.ceil(JOBS / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    // Rotate the order each round so no variant always runs first (or last).
    const order = names.map((_, i) => names[(i + round) % names.length] as Variant);
    for (const name of order) {
      elapsed[name] += await timed(bodies[name].slice(round * perRound, (round + 1) * perRound), variants[name]);
    }
    process.stdout.write(`round ${round + 1}/${ROUNDS}\r`);
  }
  const duplicateMs = await timed(bodies.harness, async (body) => {
    const result = await bound.deliver({ body, deliveryCount: 2 });
    if (result.outcome !== "duplicate") throw new Error(`duplicates: unexpected ${result.outcome}`);
  });

  const [check] = await sql<{ n: number }[]>`select count(*)::int as n from bench_ledger`;
  const expectedRows = (JOBS + WARMUP) * names.length;
  if (check?.n !== expectedRows) throw new Error(`ledger has ${check?.n} rows, expected ${expectedRows}`);

  // TTL cleanup of CLEANUP_ROWS expired fence rows while 16 consumers keep
  // inserting fences: deleted rows/s, and the consumers' p99 latency during the
  // cleanup over their p99 just before it (issue #4: goal <= 2).
  await sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), ${consumer.name}, now() - interval '30 days' from generate_series(1, ${CLEANUP_ROWS})`;
  await sql`vacuum analyze core.processed_jobs`;
  const cleanupClient = postgres(url, { max: 1, onnotice: () => {} });
  const cleanup = createFenceCleanup({
    db: drizzle({ client: cleanupClient }),
    ttlMs: 7 * 86_400_000,
    consumers: [consumer],
  });
  const live = { latencies: [] as number[], stop: false };
  const consumers = Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (!live.stop) {
        const body = JSON.stringify(
          createEnvelope({ tenantId: "bench", kind: "bench.credit.v1", data: { amount: 1 } }),
        );
        const started = performance.now();
        const result = await bound.deliver({ body, deliveryCount: 1 });
        if (result.outcome !== "success") throw new Error(`live consumer: unexpected ${result.outcome}`);
        live.latencies.push(performance.now() - started);
      }
    }),
  );
  await new Promise((r) => setTimeout(r, 3000));
  const before = live.latencies.splice(0);
  const cleanupStarted = performance.now();
  const cleaned = await cleanup.run();
  const cleanupMs = performance.now() - cleanupStarted;
  const during = live.latencies.splice(0);
  live.stop = true;
  await consumers;
  await cleanupClient.end();
  if (cleaned.deleted !== CLEANUP_ROWS) throw new Error(`cleanup deleted ${cleaned.deleted}, expected ${CLEANUP_ROWS}`);
  const p99 = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length * 0.99)] ?? Number.NaN;
  console.log(
    `cleanup: ${cleaned.deleted} rows in ${Math.round(cleanupMs)} ms (${cleaned.batches} batches); ` +
      `consumer p99 ${p99(before).toFixed(1)} ms before (${before.length} jobs), ${p99(during).toFixed(1)} ms during (${during.length} jobs)`,
  );

  // Replays (#10): live p99 during an unthrottled replay, and a 100,000-letter batch's rate.
  // The cleanup left CLEANUP_ROWS dead fence rows: vacuum them now, so that
  // autovacuum does not do it in the middle of the replay's latency measurement.
  await sql`vacuum analyze core.processed_jobs, bench_ledger`;
  const replay = await replayBenchmarks(url);

  const rate = (ms: number) => Math.round((JOBS / ms) * 1000);
  const result = {
    harness_jobs_per_s: rate(elapsed.harness),
    handwritten_drizzle_jobs_per_s: rate(elapsed.handwritten_drizzle),
    raw_postgresjs_jobs_per_s: rate(elapsed.raw_postgresjs),
    ratio: Number((elapsed.handwritten_drizzle / elapsed.harness).toFixed(3)),
    ratio_raw: Number((elapsed.raw_postgresjs / elapsed.harness).toFixed(3)),
    raw_postgresjs_drizzle_query_jobs_per_s: rate(elapsed.raw_postgresjs_drizzle_query),
    ratio_raw_drizzle_query: Number((elapsed.raw_postgresjs_drizzle_query / elapsed.harness).toFixed(3)),
    harness_prepared_jobs_per_s: rate(elapsed.harness_prepared),
    ratio_raw_prepared: Number((elapsed.raw_postgresjs / elapsed.harness_prepared).toFixed(3)),
    duplicate_jobs_per_s: rate(duplicateMs),
    cleanup_deleted_rows_per_s: Math.round((cleaned.deleted / cleanupMs) * 1000),
    cleanup_p99_ratio: Number((p99(during) / p99(before)).toFixed(3)),
    ...replay,
    // The child benchmarks (bench/child-bench.ts), each in a process of its own:
    // limits_* and fanout_* (#20), soak_* (#12 item 4: SOAK_JOBS, default 1,000,000).
    ...(await runChildBenches()),
  };
  console.log(
    `jobs per variant: ${JOBS}, concurrency ${CONCURRENCY}, ${ROUNDS} interleaved rounds, Postgres from ${server.source}`,
  );
  console.log(JSON.stringify(result));
} finally {
  await bench.drop();
}
