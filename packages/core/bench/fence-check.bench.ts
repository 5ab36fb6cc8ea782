/**
 * `pnpm --filter @softcrum/core bench:fence`: what the two things #8 added to
 * the work transaction on the database side cost, apart from everything else
 * the harness does: the pending-letter check of the fence (item 3) and the
 * server-side bounds of the transaction (item 12). Each variant is the raw
 * benchmark's transaction (BEGIN pipelined with the fence insert, one ledger
 * insert, COMMIT, prepared statements, concurrency 16) with a different BEGIN
 * or RETURNING on the fence:
 *   none:           neither (what `raw_postgresjs` of `pnpm bench` does);
 *   pending_letter: the check, `core.pending_letter()` (migration 0012);
 *   subquery:       the same lookup as a plain scalar subquery. It reads with
 *                   the statement's snapshot, so it would miss a letter
 *                   committed while the insert waited on the fence key: not
 *                   a correct check, only a floor for any read of core.dead_letters;
 *   bounds:         the bounds, `set local` in BEGIN's message, no check;
 *   harness:        both, exactly what the harness sends.
 * Interleaved in rounds, so all see the same machine. The last line is JSON:
 * each variant's jobs/s and its ratio to `none`.
 */
import { randomUUID } from "node:crypto";
import { benchDatabase } from "./bench-database.ts";

const JOBS = Number(process.env["BENCH_JOBS"] ?? 24_000);
const CONCURRENCY = 16;
const ROUNDS = 16;

const FENCE = "insert into core.processed_jobs (job_id, consumer) values ($1, $2) on conflict do nothing returning ";
const CHECK = "core.pending_letter($1, $2)";
// The harness's BEGIN for the default timeoutMs (25 s, plus its 1 s grace).
const BOUNDED_BEGIN =
  "begin; set local statement_timeout = '26000ms'; set local idle_in_transaction_session_timeout = '26000ms'";
const VARIANTS = {
  none: ["begin", "1"],
  pending_letter: ["begin", CHECK],
  subquery: [
    "begin",
    "(select id::text || ' ' || error_class from core.dead_letters where job_id = $1::text and consumer = $2 and status = 'pending_review')",
  ],
  bounds: [BOUNDED_BEGIN, "1"],
  harness: [BOUNDED_BEGIN, CHECK],
} as const;
type Variant = keyof typeof VARIANTS;

const bench = await benchDatabase("fence_check", CONCURRENCY);
const { sql } = bench;
try {
  const job = (variant: Variant) => async () => {
    const id = randomUUID();
    const conn = await sql.reserve();
    try {
      const [begin, returning] = VARIANTS[variant];
      await Promise.all([conn.unsafe(begin), conn.unsafe(FENCE + returning, [id, "bench.fence"], { prepare: true })]);
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

  const names = Object.keys(VARIANTS) as Variant[];
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
