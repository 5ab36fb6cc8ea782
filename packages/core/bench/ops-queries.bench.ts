/**
 * `pnpm --filter @softcrum/core bench:ops`: figures for issue #9 items 5, 10, 11.
 * - The operator queries and the depth gauge at BENCH_LETTERS dead letters
 *   (default 1,000,000, every 10th pending), without the partial indexes of
 *   migration 0006 ("before", today's main) and with them ("after").
 * - Fence inserts while an index is built on BENCH_FENCES fences (default
 *   2,000,000): a plain CREATE INDEX (what drizzle's one-transaction migrator
 *   can do) against CREATE INDEX CONCURRENTLY (a no-transaction migration).
 * Prints a table and, last, one line of JSON.
 */
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { migrateCore } from "../src/db/migrate.ts";
import { createOps } from "../src/ops/index.ts";

const LETTERS = Number(process.env["BENCH_LETTERS"] ?? 1_000_000);
const FENCES = Number(process.env["BENCH_FENCES"] ?? 2_000_000);
const RUNS = 5;

const server = await findPostgres();
const database = uniqueDatabaseName("softcrum_bench", "ops_queries");
await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(database)}`);
const url = withDatabase(server.adminUrl, database);
const sql = postgres(url, { max: 4, onnotice: () => {} });
const spread = (n: number, mod: number) => `((hashint4(i * 31 + ${n})::bigint + 2147483648) % ${mod})`;
const result: Record<string, unknown> = { letters: LETTERS, pending: Math.floor(LETTERS / 10), fences: FENCES };
try {
  await migrateCore(url);
  let started = performance.now();
  await sql.unsafe(`
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
      tenant_id, kind, created_at, status_changed_at, status_changed_by)
    select gen_random_uuid(), gen_random_uuid()::text, 'queue-' || ${spread(1, 10)}, 'consumer-' || ${spread(2, 2)},
      repeat('x', 400), 5, 'TypeError: fetch failed',
      (array['poison', 'exhausted', 'permanent', 'expired'])[1 + ${spread(3, 4)}],
      case when i % 10 = 0 then 'pending_review' else 'replayed' end,
      'tenant-' || ${spread(4, 1000)}, 'kind-' || ${spread(5, 50)}, now() - make_interval(secs => i),
      case when i % 10 = 0 then null else now() end, case when i % 10 = 0 then null else 'ops' end
    from generate_series(1, ${LETTERS}) as i`);
  await sql.unsafe("vacuum analyze core.dead_letters");
  console.log(`inserted ${LETTERS} letters in ${Math.round(performance.now() - started)} ms`);

  const ops = createOps({
    db: drizzle({ client: sql }),
    queue: {
      publish: async () => ({ messageId: null, stored: true }),
      schedule: async () => ({ messageId: null, stored: true }),
    },
  });
  const pending = { status: "pending_review" } as const;
  const queries: [string, () => Promise<unknown>][] = [
    ["list by tenant", () => ops.deadLetters.list({ ...pending, tenantId: "tenant-7" })],
    ["count by tenant", () => ops.deadLetters.count({ ...pending, tenantId: "tenant-7" })],
    ["list by queue+consumer", () => ops.deadLetters.list({ ...pending, queue: "queue-3", consumer: "consumer-1" })],
    ["count by queue+consumer", () => ops.deadLetters.count({ ...pending, queue: "queue-3", consumer: "consumer-1" })],
    ["list by kind+error class", () => ops.deadLetters.list({ ...pending, kind: "kind-4", errorClass: "poison" })],
    ["count by kind+error class", () => ops.deadLetters.count({ ...pending, kind: "kind-4", errorClass: "poison" })],
    ["depth gauge", () => ops.deadLetters.depth()],
  ];
  const timeAll = async () => {
    const out: Record<string, number> = {};
    for (const [name, run] of queries) {
      await run();
      const times: number[] = [];
      for (let r = 0; r < RUNS; r++) {
        const t = performance.now();
        await run();
        times.push(performance.now() - t);
      }
      out[name] = Math.round((times.sort((a, b) => a - b)[Math.floor(RUNS / 2)] ?? 0) * 100) / 100;
    }
    return out;
  };
  const partial = [
    "dead_letters_pending_tenant_idx",
    "dead_letters_pending_queue_consumer_idx",
    "dead_letters_pending_kind_class_idx",
  ];
  const definitions = await sql<{ indexdef: string }[]>`
    select indexdef from pg_indexes where schemaname = 'core' and indexname in ${sql(partial)}`;
  for (const name of partial) await sql.unsafe(`drop index core.${name}`);
  const before = await timeAll();
  started = performance.now();
  for (const { indexdef } of definitions)
    await sql.unsafe(indexdef.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY"));
  result["pendingIndexesBuildMs"] = Math.round(performance.now() - started);
  await sql.unsafe("vacuum analyze core.dead_letters");
  const after = await timeAll();
  result["queriesMedianMs"] = Object.fromEntries(queries.map(([n]) => [n, { before: before[n], after: after[n] }]));
  console.log(`\n${"query".padEnd(28)}${"before ms".padStart(12)}${"after ms".padStart(12)}  (median of ${RUNS})`);
  for (const [name] of queries) {
    console.log(`${name.padEnd(28)}${String(before[name]).padStart(12)}${String(after[name]).padStart(12)}`);
  }

  // Item 5: fence inserts while an index on processed_jobs is built.
  started = performance.now();
  await sql.unsafe(`insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'bench', now() - make_interval(secs => i) from generate_series(1, ${FENCES}) as i`);
  await sql.unsafe("vacuum analyze core.processed_jobs");
  console.log(`\ninserted ${FENCES} fences in ${Math.round(performance.now() - started)} ms`);
  const writer = postgres(url, { max: 1, onnotice: () => {} });
  const fencesDuring = async (build: string) => {
    let done = false;
    let inserts = 0;
    let worst = 0;
    const loop = (async () => {
      while (!done) {
        const t = performance.now();
        await writer`insert into core.processed_jobs (job_id, consumer) values (gen_random_uuid(), 'bench-live')`;
        worst = Math.max(worst, performance.now() - t);
        inserts++;
      }
    })();
    await new Promise((resolve) => setTimeout(resolve, 200));
    const t = performance.now();
    await sql.unsafe(build);
    const buildMs = performance.now() - t;
    done = true;
    await loop;
    return { buildMs: Math.round(buildMs), worstFenceInsertMs: Math.round(worst), fenceInserts: inserts };
  };
  const plain = await fencesDuring(
    'create index "bench_plain" on core.processed_jobs (processed_at, job_id, consumer)',
  );
  await sql.unsafe('drop index core."bench_plain"');
  const concurrent = await fencesDuring(
    'create index concurrently "bench_concurrent" on core.processed_jobs (processed_at, job_id, consumer)',
  );
  await writer.end();
  result["fenceIndexBuild"] = { plain, concurrent };
  console.log(`index on ${FENCES} fences   build ms   worst fence insert ms   fence inserts during`);
  for (const [name, r] of Object.entries({ plain, concurrent })) {
    console.log(
      `${name.padEnd(22)}${String(r.buildMs).padStart(9)}${String(r.worstFenceInsertMs).padStart(24)}${String(r.fenceInserts).padStart(23)}`,
    );
  }
  console.log(JSON.stringify(result));
} finally {
  await sql.end();
  await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
  await server.stop();
}
