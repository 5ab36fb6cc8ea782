/**
 * `pnpm --filter @softcrum/core bench:fence-partitions`: the partitioned fence
 * (#23 item 4, ADR 0014) at scale, on a throwaway database migrated like any
 * other (the fence partitioned by day of its UUID v7 time).
 * 1. Fence insert p99 with 100,000 fences, then with 20,000,000
 *    (`FENCE_ROWS`), filled by generate_series in time order over the last
 *    eight days and a bit (from the midnight eight days ago to now): four
 *    paced writers (one fence every PACE_MS each, so the machine is not
 *    saturated), each in its own transaction, the harness's fence statement
 *    (`ON CONFLICT DO NOTHING RETURNING core.pending_letter(...)`), prepared;
 *    one in ten a copy of an existing fence (a duplicate). Goal: ratio ≤ 1.2.
 * 2. Three TTL cleanups, with TTL 7, 6, then 5 days: each time one day (about
 *    2.3M fences at 20M) is past it and goes with its partition; 1,000 of its
 *    fences were written an hour ago (late copies) and 400 jobs have letters
 *    (pending, or replayed an hour ago), so they move to the default
 *    partition in the detach's transaction; the default partition also holds
 *    5,000 expired fences (`DEFAULT_EXPIRED`) for the DELETE batches (what is
 *    left there at steady state; their cost at scale is `pnpm bench`'s
 *    cleanup_p99_ratio). Measured: the detach and move
 *    (`fence_table_held_ms`: the moment fence inserts wait for); the drop of
 *    the detached table (a lock on that table only: the unlink of its files,
 *    which the filesystem decides); together `drop_partition_ms`; the read
 *    before them that looks for other consumers' fences (no lock that stops a
 *    write); and the live writers' p99 in the 10 s from the run's start
 *    (longer if the run is) over their p99 in the 10 s before. Goal ≤ 1.2. A
 *    run of a few hundred ms spans too few inserts for a p99 of its own (it
 *    would be their maximum): that p99 and the maximum are printed too
 *    (`live_p99_ms_run_only`, `live_max_ms_run_only`): the inserts that
 *    queued behind the detach's moment. The noise floor of that ratio, in
 *    the same run: the p99 of the 10 s before the cleanup over the p99 of
 *    the 10 s before those, with no cleanup in either
 *    (`live_p99_quiet_ratio`). The keys are the three events' medians; each
 *    event's figures follow.
 * The last line is one JSON object.
 */
import { drizzle } from "drizzle-orm/postgres-js";
import { uuidv7 } from "uuidv7";
import type { AnyPgDatabase } from "../src/db/types.ts";
import { createFenceCleanup } from "../src/maintenance/fence-cleanup.ts";
import { ensureFencePartitions } from "../src/maintenance/fence-partitions.ts";
import { benchDatabase } from "./bench-database.ts";

const BIG = Number(process.env["FENCE_ROWS"] ?? 20_000_000);
const SMALL = 100_000;
const SAMPLES = Number(process.env["BENCH_SAMPLES"] ?? 12_000);
const WRITERS = 4;
const PACE_MS = 10;
const CONSUMER = "bench.fence";
const FENCE = `insert into core.processed_jobs (job_id, consumer, processed_at) values ($1, $2, clock_timestamp()) on conflict do nothing
  returning core.pending_letter($1, $2) as detail`;
const DAY_MS = 86_400_000;
/** Expired fences in the default partition at the cleanup (steady state: days without a partition, moved fences). */
const DEFAULT_EXPIRED = Number(process.env["DEFAULT_EXPIRED"] ?? 5_000);
/** The live writers' windows before the cleanup and from its start. */
const WINDOW_MS = 10_000;
/** Cleanup events: each drops one more day (TTL 7, 6, 5 days); the figures are their medians. */
const CLEANUPS = 3;

const bench = await benchDatabase("fence_partitions", 16);
const { sql } = bench;
const log = (line: string) => console.error(line);
const p = (values: number[], q: number) =>
  [...values].sort((a, b) => a - b)[Math.floor(values.length * q)] ?? Number.NaN;
const round = (n: number, digits = 3) => Number(n.toFixed(digits));

try {
  const [clock] = await sql<{ today: string; start: string }[]>`
    select to_char((now() at time zone 'UTC')::date, 'YYYY-MM-DD') as today,
           (extract(epoch from ((now() at time zone 'UTC')::date - 8)::timestamp) * 1000)::bigint::text as start`;
  const today = clock?.today as string;
  const startMs = Number(clock?.start);
  const dayOf = (offset: number) =>
    new Date(Date.parse(`${today}T00:00:00Z`) + offset * DAY_MS).toISOString().slice(0, 10);
  // An empty database: its days can be created in the past (no fence of them exists yet).
  const db = drizzle({ client: sql }) as unknown as AnyPgDatabase;
  await ensureFencePartitions({ db, days: { first: dayOf(-9), last: dayOf(7) } });

  /** Fences `from`..`to` of `count`, each at its own time over [start, now), in time order: one statement per slice. */
  const fill = async (count: number, from: number, to: number, salt: string) => {
    const spanMs = Date.now() - startMs;
    const slice = 1_000_000;
    for (let a = from; a <= to; a += slice) {
      const b = Math.min(to, a + slice - 1);
      await sql`
        insert into core.processed_jobs (job_id, consumer, processed_at)
        select (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid, ${CONSUMER},
               to_timestamp(ms / 1000.0) + interval '50 milliseconds'
        from generate_series(${a}::bigint, ${b}::bigint) n,
             lateral (select ${startMs}::bigint + (n * ${spanMs}::bigint) / ${count}::bigint as ms,
                             md5(${salt} || n::text) as h) x`;
      if (count > SMALL) log(`  ${b.toLocaleString("en")} / ${count.toLocaleString("en")} fences`);
    }
    // Measured at steady state, not in the write-back of a bulk load.
    await sql`vacuum analyze core.processed_jobs`;
    await sql`checkpoint`;
    await new Promise((resolve) => setTimeout(resolve, 5_000));
  };
  /** Job ids of existing fences from `days` days ago on (all: 9), for copies. */
  const existing = async (days = 9) =>
    (
      await sql<{ job_id: string }[]>`
        select job_id from core.processed_jobs tablesample bernoulli (0.05)
        where consumer = ${CONSUMER} and job_id >= core.fence_day_bound((now() at time zone 'UTC')::date - ${days}::int)
        order by random() limit 2000`
    ).map((r) => r.job_id);

  /** Paced writers until `done()`; each sample is one fence insert's latency, stamped. */
  const write = async (copies: string[], done: (count: number) => boolean) => {
    const samples: { at: number; ms: number; copy: boolean }[] = [];
    await Promise.all(
      Array.from({ length: WRITERS }, async (_, w) => {
        const conn = await sql.reserve();
        try {
          for (let i = 0; !done(samples.length); i++) {
            const tick = performance.now();
            const copy = i % 10 === 9 && copies.length > 0;
            const id = copy ? (copies[(i * WRITERS + w) % copies.length] as string) : uuidv7();
            await conn.unsafe("begin");
            const started = performance.now();
            await conn.unsafe(FENCE, [id, CONSUMER], { prepare: true });
            samples.push({ at: started, ms: performance.now() - started, copy });
            await conn.unsafe("commit");
            const rest = PACE_MS - (performance.now() - tick);
            if (rest > 0) await new Promise((resolve) => setTimeout(resolve, rest));
          }
        } finally {
          conn.release();
        }
      }),
    );
    return samples;
  };
  const fenceP99 = async () => {
    const copies = await existing();
    await write(copies, (n) => n >= 1_000); // warm-up, off the clock
    const samples = await write(copies, (n) => n >= SAMPLES);
    const all = samples.map((s) => s.ms);
    return {
      p50: p(all, 0.5),
      p99: p(all, 0.99),
      p99New: p(
        samples.filter((s) => !s.copy).map((s) => s.ms),
        0.99,
      ),
      p99Copy: p(
        samples.filter((s) => s.copy).map((s) => s.ms),
        0.99,
      ),
    };
  };

  log(`filling ${SMALL.toLocaleString("en")} fences`);
  await fill(SMALL, 1, SMALL, "s");
  const small = await fenceP99();
  log(`fence insert at ${SMALL.toLocaleString("en")}: p50 ${small.p50.toFixed(3)} ms, p99 ${small.p99.toFixed(3)} ms`);
  const fillStarted = performance.now();
  log(`filling to ${BIG.toLocaleString("en")} fences`);
  await fill(BIG - SMALL, 1, BIG - SMALL, "b");
  const fillSeconds = (performance.now() - fillStarted) / 1000;
  const [total] = await sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`;
  const big = await fenceP99();
  log(
    `fence insert at ${(total?.n ?? 0).toLocaleString("en")}: p50 ${big.p50.toFixed(3)} ms, p99 ${big.p99.toFixed(3)} ms`,
  );

  // Every statement the cleanup sends, timed by its text.
  let timings: { text: string; ms: number }[] = [];
  const timed = new Proxy(db, {
    get(target, key, receiver) {
      if (key !== "execute") return Reflect.get(target, key, receiver);
      return async (query: Parameters<AnyPgDatabase["execute"]>[0]) => {
        const started = performance.now();
        try {
          return await target.execute(query);
        } finally {
          const { sql: text } = (
            target as unknown as { dialect: { sqlToQuery(q: unknown): { sql: string } } }
          ).dialect.sqlToQuery(query);
          timings.push({ text, ms: performance.now() - started });
        }
      };
    },
  });
  // Copies of jobs of the days no event drops (a copy of a job whose fence is
  // being deleted or moved right now waits for that, by design).
  const copies = await existing(CLEANUPS + 1);

  /** One cleanup event: the day `8 - k` days ago goes (TTL `7 - k` days), with live writers before and during. */
  const cleanupEvent = async (k: number) => {
    const day = `processed_jobs_p${dayOf(-8 + k).replaceAll("-", "")}`;
    // Late copies of the day's jobs, letters of others, and expired fences in the default partition.
    await sql.unsafe(`update core.${day} set processed_at = now() - interval '1 hour'
      where ctid in (select ctid from core.${day} tablesample system (1) limit 1000)`);
    await sql.unsafe(`
      insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                     status_changed_at, status_changed_by, status_reason)
      select gen_random_uuid(), job_id::text, 'q', 'bench.other', '{}', 5, 'e', 'exhausted',
             case when n % 2 = 0 then 'pending_review' else 'replayed' end,
             case when n % 2 = 0 then null else now() - interval '1 hour' end,
             case when n % 2 = 0 then null else 'ops' end, 'r'
      from (select job_id, row_number() over () as n from core.${day} tablesample system (1)
            where processed_at < now() - interval '1 day' limit 400) x`);
    await sql`
      insert into core.processed_jobs (job_id, consumer, processed_at)
      select (lpad(to_hex(${startMs}::bigint - (12 + ${k}::int) * ${DAY_MS}::bigint + n * 1000), 12, '0') || '70008' || lpad(to_hex(n), 15, '0'))::uuid,
             ${CONSUMER}, now() - interval '20 days'
      from generate_series(1, ${DEFAULT_EXPIRED}::int) n`;
    await sql`vacuum analyze core.processed_jobs`;
    await sql`checkpoint`;
    const [size] = await sql<{ rows: number; mb: number }[]>`
      select c.reltuples::bigint::int as rows, (pg_total_relation_size(c.oid) / 1048576)::int as mb
      from pg_class c where c.relname = ${day}`;
    const cleanup = createFenceCleanup({
      db: timed,
      ttlMs: (7 - k) * DAY_MS,
      consumers: [{ name: CONSUMER, retryPolicy: { maxAttempts: 5, baseDelayMs: 30_000, maxDelayMs: 3_600_000 } }],
    });
    timings = [];
    let done = false;
    const live = write(copies, () => done);
    await new Promise((resolve) => setTimeout(resolve, 1_000)); // warm-up, off the clock
    // Two quiet windows in a row, no cleanup in either: how far the p99 of
    // one 10 s window moves from the next on this machine with nothing
    // changed (the noise floor the cleanup's ratio is read against).
    const quietAt = performance.now();
    await new Promise((resolve) => setTimeout(resolve, WINDOW_MS));
    const beforeAt = performance.now();
    await new Promise((resolve) => setTimeout(resolve, WINDOW_MS));
    const duringAt = performance.now();
    const report = await cleanup.run();
    const endAt = performance.now();
    // A run of a few hundred ms spans too few inserts for a p99 (it would be
    // their maximum): the window from its start is as long as the one before.
    const windowEnd = Math.max(endAt, duringAt + WINDOW_MS);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, windowEnd - performance.now())));
    done = true;
    const samples = await live;
    const window = (from: number, to: number) => samples.filter((s) => s.at >= from && s.at < to).map((s) => s.ms);
    const quiet = window(quietAt, beforeAt);
    const before = window(beforeAt, duringAt);
    const during = window(duringAt, windowEnd);
    const run = window(duringAt, endAt);
    const afterRun = window(endAt, windowEnd);
    const longest = (pattern: string) =>
      Math.max(0, ...timings.filter((t) => t.text.includes(pattern)).map((t) => t.ms));
    const event = {
      day,
      fences: size?.rows ?? 0,
      mb: size?.mb ?? 0,
      report,
      held: longest("fence_partition_detach"),
      drop: longest("fence_partition_drop_detached"),
      read: longest("p.consumer not in"),
      cleanupMs: endAt - duringAt,
      p99Before: p(before, 0.99),
      p99During: p(during, 0.99),
      ratio: p(during, 0.99) / p(before, 0.99),
      quietRatio: p(before, 0.99) / p(quiet, 0.99),
      samplesBefore: before.length,
      samplesDuring: during.length,
      samplesRun: run.length,
      p99Run: p(run, 0.99),
      maxRun: Math.max(0, ...run),
    };
    log(
      `cleanup of ${day} (~${event.fences} fences, ${event.mb} MB): dropped ${report.partitionsDropped}, moved ${report.rowsMovedToDefault}, ` +
        `deleted ${report.deleted}; read ${event.read.toFixed(0)} ms, detach+move ${event.held.toFixed(1)} ms, drop ${event.drop.toFixed(1)} ms; ` +
        `live p99 ${event.p99Before.toFixed(3)} ms before (${before.length}), ${event.p99During.toFixed(3)} ms during (${during.length}): ` +
        `${event.ratio.toFixed(3)} (two quiet windows before it: ${event.quietRatio.toFixed(3)}); in the run itself (${run.length}) p99 ${event.p99Run.toFixed(1)} ms, max ${event.maxRun.toFixed(1)} ms, ` +
        `${run.filter((ms) => ms > event.p99Before).length} above the p99 before; after it (${afterRun.length}) p99 ${p(afterRun, 0.99).toFixed(3)} ms`,
    );
    return event;
  };
  const events = [];
  for (let k = 0; k < CLEANUPS; k++) events.push(await cleanupEvent(k));
  const median = (values: number[]) => p(values, 0.5);
  const first = events[0];
  console.log(
    JSON.stringify({
      fence_p99_ratio_20m_vs_100k: round(big.p99 / small.p99),
      drop_partition_ms: round(median(events.map((e) => e.held + e.drop)), 1),
      live_p99_during_cleanup_ratio: round(median(events.map((e) => e.ratio))),
      live_p99_quiet_ratio: round(median(events.map((e) => e.quietRatio))),
      fence_rows: total?.n,
      fence_p50_ms_100k: round(small.p50),
      fence_p99_ms_100k: round(small.p99),
      fence_p50_ms_20m: round(big.p50),
      fence_p99_ms_20m: round(big.p99),
      fence_p99_new_ms_100k: round(small.p99New),
      fence_p99_new_ms_20m: round(big.p99New),
      fence_p99_copy_ms_100k: round(small.p99Copy),
      fence_p99_copy_ms_20m: round(big.p99Copy),
      cleanups: events.length,
      dropped_day_fences: first?.fences,
      dropped_day_mb: first?.mb,
      fence_table_held_ms: events.map((e) => round(e.held, 1)),
      drop_table_ms: events.map((e) => round(e.drop, 1)),
      other_consumers_read_ms: events.map((e) => round(e.read, 0)),
      rows_moved_to_default: events.map((e) => e.report.rowsMovedToDefault),
      default_rows_deleted: events.map((e) => e.report.deleted),
      cleanup_ms: events.map((e) => round(e.cleanupMs, 0)),
      live_p99_ratios: events.map((e) => round(e.ratio)),
      live_p99_quiet_ratios: events.map((e) => round(e.quietRatio)),
      live_p99_ms_before: events.map((e) => round(e.p99Before)),
      live_p99_ms_during: events.map((e) => round(e.p99During)),
      live_samples_during: events.map((e) => e.samplesDuring),
      live_samples_run_only: events.map((e) => e.samplesRun),
      live_max_ms_run_only: events.map((e) => round(e.maxRun, 1)),
      fill_seconds: round(fillSeconds, 0),
    }),
  );
} finally {
  await bench.drop();
}
