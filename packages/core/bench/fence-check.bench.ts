/**
 * `pnpm --filter @softcrum/core bench:fence`: what the pending-letter check
 * of the fence (#8 item 3) costs the database, apart from everything else the
 * harness does. Each variant is the raw benchmark's transaction (BEGIN
 * pipelined with the fence insert, one ledger insert, COMMIT, prepared
 * statements, concurrency 16) with a different RETURNING on the fence:
 *   none:           no check (what `raw_postgresjs` of `pnpm bench` does);
 *   pending_letter: `core.pending_letter()` (migration 0012), what the harness sends;
 *   subquery:       the same lookup as a plain scalar subquery. It reads with
 *                   the statement's snapshot, so it would miss a letter
 *                   committed while the insert waited on the fence key: not
 *                   a correct check, only a floor for any read of core.dead_letters.
 * Interleaved in rounds, so all see the same machine. The last line is JSON:
 * each variant's jobs/s and its ratio to `none`.
 */
import { randomUUID } from "node:crypto";
import { benchDatabase } from "./bench-database.ts";

const JOBS = Number(process.env["BENCH_JOBS"] ?? 24_000);
const CONCURRENCY = 16;
const ROUNDS = 16;

const FENCE = "insert into core.processed_jobs (job_id, consumer) values ($1, $2) on conflict do nothing returning ";
const RETURNING = {
  none: "1",
  pending_letter: "core.pending_letter($1, $2)",
  subquery:
    "(select id::text || ' ' || error_class from core.dead_letters where job_id = $1::text and consumer = $2 and status = 'pending_review')",
} as const;
type Variant = keyof typeof RETURNING;

const bench = await benchDatabase("fence_check", CONCURRENCY);
const { sql } = bench;
try {
  const job = (variant: Variant) => async () => {
    const id = randomUUID();
    const conn = await sql.reserve();
    try {
      await Promise.all([
        conn.unsafe("begin"),
        conn.unsafe(FENCE + RETURNING[variant], [id, "bench.fence"], { prepare: true }),
      ]);
      await conn.unsafe("insert into bench_ledger (job_id, amount) values ($1, 1)", [id], { prepare: true });
      await conn.unsafe("commit");
    } finally {
      conn.release();
    }
  };
  const timed = async (count: number, work: () => Promise<void>) => {
    let next = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next++ < count) await work();
      }),
    );
    return performance.now() - started;
  };

  const names = Object.keys(RETURNING) as Variant[];
  for (const name of names) await timed(500, job(name)); // warm-up, off the clock
  const elapsed = Object.fromEntries(names.map((n) => [n, 0])) as Record<Variant, number>;
  for (let round = 0; round < ROUNDS; round++) {
    for (let i = 0; i < names.length; i++) {
      const name = names[(i + round) % names.length] as Variant;
      elapsed[name] += await timed(JOBS / ROUNDS, job(name));
    }
  }
  const rate = (name: Variant) => Math.round(JOBS / (elapsed[name] / 1000));
  console.log(
    JSON.stringify(
      Object.fromEntries(
        names.map((n) => [n, { jobs_per_s: rate(n), ratio_to_none: Number((rate(n) / rate("none")).toFixed(3)) }]),
      ),
    ),
  );
} finally {
  await bench.drop();
}
