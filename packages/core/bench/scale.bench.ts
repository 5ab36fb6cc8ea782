/**
 * `pnpm --filter @softcrum/core exec tsx bench/scale.bench.ts`: the operator
 * queries of #9 items 12 and 13 at scale, before and after. On a fresh
 * database: SCALE_LETTERS dead letters (default 1,000,000: 10% pending, 60%
 * replayed in batches of 10,000 of which 5% failed again, 30% discarded),
 * 1.5 × that many expired fences (+ 0.5 × fresh ones) and SCALE_AUDIT audit
 * entries (default 1,000,000). "Before" runs the statements main sent, without
 * this change's indexes; then the indexes are built (timed) and "after" calls
 * the library. The last line printed is JSON.
 */
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { defineConsumer } from "../src/index.ts";
import { createFenceCleanup } from "../src/maintenance/fence-cleanup.ts";
import { createOps } from "../src/ops/index.ts";

const LETTERS = Number(process.env["SCALE_LETTERS"] ?? 1_000_000);
const AUDIT = Number(process.env["SCALE_AUDIT"] ?? 1_000_000);
const TARGET = "0190b3c4-cccc-7000-8000-000000000003";
const TTL_HOURS = 192;

const NEW_INDEXES = {
  dead_letters_replayed_idx: `create index dead_letters_replayed_idx on core.dead_letters (id) where status = 'replayed'`,
  dead_letters_replayed_batch_idx: `create index dead_letters_replayed_batch_idx on core.dead_letters (replay_batch_id, id) where status = 'replayed'`,
  ops_audit_scope_ids_idx: `create index ops_audit_scope_ids_idx on core.ops_audit using gin ((scope -> 'ids'))`,
  ops_audit_scope_batch_idx: `create index ops_audit_scope_batch_idx on core.ops_audit ((scope ->> 'batchId'))`,
};

const ms = (t: number) => Math.round((performance.now() - t) * 10) / 10;
async function timed<T>(run: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const t = performance.now();
  const value = await run();
  return { ms: ms(t), value };
}

const server = await findPostgres();
const name = uniqueDatabaseName("softcrum_bench", "scale");
await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(name)}`);
const url = withDatabase(server.adminUrl, name);
const sql = postgres(url, { max: 4, onnotice: () => {} });
const results: Record<string, unknown> = { letters: LETTERS, audit: AUDIT };
const log = (line: string) => console.error(line);

try {
  await migrateCore(url);
  for (const index of Object.keys(NEW_INDEXES)) await sql.unsafe(`drop index if exists core.${index}`);

  log(`loading ${LETTERS} letters, ${1.5 * LETTERS} + ${0.5 * LETTERS} fences, ${AUDIT} audit entries…`);
  const load = performance.now();
  const cols = `id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
    created_at, status_changed_at, status_changed_by, status_reason, replay_batch_id`;
  const replayed = Math.round(LETTERS * 0.6);
  const failed = Math.round(replayed * 0.05);
  // Replayed letters in batches of 10,000 (batch uuid from the batch number), replayed in the last 30 days.
  await sql.unsafe(`
    insert into core.dead_letters (${cols})
    select gen_random_uuid(), gen_random_uuid()::text, 'q', 'bench.c', '{"v":1}', 5, 'e', 'exhausted', 'replayed',
           now() - interval '40 days', now() - make_interval(secs => (i % 2592000)), 'ops', 'r',
           ('0190b3c4-0000-7000-8000-' || lpad(to_hex(i / 10000), 12, '0'))::uuid
    from generate_series(0, ${replayed - 1}) i`);
  // 5% of them failed again: a pending letter of the same job after the replay.
  await sql.unsafe(`
    insert into core.dead_letters (${cols})
    select gen_random_uuid(), job_id, 'q', 'bench.c', '{"v":1}', 5, 'e', 'exhausted', 'pending_review',
           status_changed_at + interval '1 minute', null, null, null, null
    from core.dead_letters tablesample bernoulli (5) where status = 'replayed' limit ${failed}`);
  await sql.unsafe(`
    insert into core.dead_letters (${cols})
    select gen_random_uuid(), gen_random_uuid()::text, 'q', 'bench.c', '{"v":1}', 5, 'e', 'exhausted',
           case when i <= ${Math.round(LETTERS * 0.3)} then 'discarded' else 'pending_review' end,
           now() - make_interval(secs => (i % 2592000)),
           case when i <= ${Math.round(LETTERS * 0.3)} then now() end,
           case when i <= ${Math.round(LETTERS * 0.3)} then 'ops' end, 'r', null
    from generate_series(1, ${LETTERS - replayed - failed}) i`);
  // Fences: the pending letters' jobs and many others expired, a third as many fresh.
  // (A fence of a job with a pending letter is refused at COMMIT by a trigger: a bench may skip it.)
  await sql.begin(async (tx) => {
    await tx`set local session_replication_role = replica`;
    await tx.unsafe(`
      insert into core.processed_jobs (job_id, consumer, processed_at)
      select job_id::uuid, 'bench.c', now() - interval '20 days' from core.dead_letters where status = 'pending_review'`);
  });
  await sql.unsafe(`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'bench.c', now() - interval '9 days' - make_interval(secs => i)
    from generate_series(1, ${1.5 * LETTERS}) i`);
  await sql.unsafe(`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select gen_random_uuid(), 'bench.c', now() - make_interval(secs => i % 86400) from generate_series(1, ${0.5 * LETTERS}) i`);
  // Audit: ids of one to three letters, or a batch; a few name the target letter.
  await sql.unsafe(`
    insert into core.ops_audit (id, at, operator, action, scope, result)
    select gen_random_uuid(), now() - make_interval(secs => i), 'ops', 'dead_letter.discard',
           case when i % 4 = 0 then jsonb_build_object('batchId', gen_random_uuid())
                else jsonb_build_object('ids', jsonb_build_array(gen_random_uuid(), gen_random_uuid()), 'reason', 'r') end,
           'ok'
    from generate_series(1, ${AUDIT}) i`);
  await sql.unsafe(`
    insert into core.dead_letters (${cols})
    values ('${TARGET}', 'target', 'q', 'bench.c', '{}', 5, 'e', 'exhausted', 'pending_review', now(), null, null, null, null);
    insert into core.ops_audit (id, at, operator, action, scope, result)
    select gen_random_uuid(), now(), 'ana', 'dead_letter.discard', jsonb_build_object('ids', jsonb_build_array('${TARGET}')), 'rejected'
    from generate_series(1, 5)`);
  await sql`vacuum analyze core.dead_letters`;
  await sql`vacuum analyze core.processed_jobs`;
  await sql`vacuum analyze core.ops_audit`;
  results["loadMs"] = ms(load);
  const [someBatch] = await sql<{ b: string }[]>`
    select replay_batch_id::text as b from core.dead_letters where status = 'replayed' and replay_batch_id is not null limit 1`;
  const batchId = someBatch?.b as string;

  /** EXPLAIN ANALYZE of a statement: time, shared buffers touched, temp blocks written. */
  async function analyze(statement: string, parameters: unknown[] = []) {
    const [row] = await sql.unsafe<{ "QUERY PLAN": { Plan: Record<string, number>; "Execution Time": number }[] }[]>(
      `explain (analyze, buffers, format json) ${statement}`,
      parameters as never[],
    );
    const plan = row?.["QUERY PLAN"][0];
    return {
      ms: Math.round((plan?.["Execution Time"] ?? 0) * 10) / 10,
      sharedBuffers: (plan?.Plan["Shared Hit Blocks"] ?? 0) + (plan?.Plan["Shared Read Blocks"] ?? 0),
      tempWrittenMB: Math.round(((plan?.Plan["Temp Written Blocks"] ?? 0) * 8) / 1024),
    };
  }

  // ---- before: the statements main sent ----
  log("before…");
  const mainReplayView = (batch: boolean) => `
    select n.id, o.id as replayed_from, o.replay_batch_id as batch_id
    from core.dead_letters n
    cross join lateral (
      select o.id, o.replay_batch_id from core.dead_letters o
      where o.job_id = n.job_id and o.consumer = n.consumer and o.id <> n.id
        and o.status = 'replayed' and o.status_changed_at <= n.created_at
      order by o.status_changed_at desc limit 1
    ) o
    where n.job_id is not null ${batch ? "and o.replay_batch_id = $1" : ""}
    order by n.id`;
  const mainHistory = `
    select at, operator, action, result, detail from core.ops_audit
    where scope -> 'ids' ? $1 order by at`;
  const mainKept = `
    select count(*) filter (where k.pending)::int as pending, count(*) filter (where not k.pending)::int as replays
    from core.processed_jobs p
    join (
      select d.job_id, bool_or(d.status = 'pending_review') as pending from core.dead_letters d
      where d.status = 'pending_review'
         or (d.status in ('replayed', 'discarded') and d.status_changed_at >= now() - make_interval(secs => $1))
      group by d.job_id
    ) k on k.job_id = p.job_id::text
    where p.consumer in ('bench.c') and p.processed_at < now() - make_interval(secs => $1)`;
  results["before"] = {
    failedAfterReplayAll: await analyze(mainReplayView(false)),
    failedAfterReplayBatch: await analyze(mainReplayView(true), [batchId]),
    history: await analyze(mainHistory, [TARGET]),
    cleanupPreCount: await analyze(mainKept, [TTL_HOURS * 3600]),
  };
  log(JSON.stringify(results["before"]));

  // ---- the indexes, as the migration builds them (CONCURRENTLY in production) ----
  const builds: Record<string, number> = {};
  for (const [index, ddl] of Object.entries(NEW_INDEXES)) builds[index] = (await timed(() => sql.unsafe(ddl))).ms;
  await sql`analyze core.dead_letters`;
  await sql`analyze core.ops_audit`;
  results["indexBuildMs"] = builds;

  // ---- after: the library ----
  log("after…");
  const client = postgres(url, { max: 2, onnotice: () => {} });
  const db = drizzle({ client });
  const ops = createOps({ db, queue: createMemoryQueue() });
  const firstPage = await timed(() => ops.deadLetters.failedAfterReplay({}, { limit: 50 }));
  const batchPage = await timed(() => ops.deadLetters.failedAfterReplay({ batchId }, { limit: 50 }));
  // The whole batch, page after page.
  const wholeBatch = await timed(async () => {
    let cursor: string | undefined;
    let rows = 0;
    let pages = 0;
    for (;;) {
      const page = await ops.deadLetters.failedAfterReplay({ batchId }, { limit: 500, ...(cursor ? { cursor } : {}) });
      rows += page.items.length;
      pages += 1;
      if (!page.nextCursor) return { rows, pages };
      cursor = page.nextCursor;
    }
  });
  // Every failure after replay in the database, 500 a page.
  const everything = await timed(async () => {
    let cursor: string | undefined;
    let rows = 0;
    let pages = 0;
    for (;;) {
      const page = await ops.deadLetters.failedAfterReplay({}, { limit: 500, ...(cursor ? { cursor } : {}) });
      rows += page.items.length;
      pages += 1;
      if (!page.nextCursor) return { rows, pages };
      cursor = page.nextCursor;
    }
  });
  const history = await timed(() => ops.deadLetters.history(TARGET));
  const consumer = defineConsumer({
    name: "bench.c",
    queue: "q",
    kind: "k.v1",
    schema: (await import("zod")).z.object({}),
    handle: async () => {},
  });
  const cleanup = createFenceCleanup({ db, ttlMs: TTL_HOURS * 3_600_000, consumers: [consumer] });
  const dryRun = await timed(() => cleanup.run({ dryRun: true, maxBatches: 200 }));
  const firstBatch = await timed(() => cleanup.run({ maxBatches: 1 }));
  await client.end();
  results["after"] = {
    failedAfterReplayFirstPage: { ms: firstPage.ms, items: firstPage.value.items.length },
    failedAfterReplayBatchFirstPage: { ms: batchPage.ms, items: batchPage.value.items.length },
    failedAfterReplayWholeBatch: { ms: wholeBatch.ms, ...wholeBatch.value },
    failedAfterReplayEverything: { ms: everything.ms, ...everything.value },
    history: { ms: history.ms, items: history.value.items.length },
    cleanupDryRun200Pages: { ms: dryRun.ms, ...dryRun.value },
    cleanupFirstBatch: {
      ms: firstBatch.ms,
      deleted: firstBatch.value.deleted,
      kept: firstBatch.value.keptForPendingDeadLetters,
    },
  };
  log(JSON.stringify(results["after"]));
} finally {
  await sql.end();
  if (process.env["SCALE_KEEP"]) log(`kept database ${name}`);
  else await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(name)} with (force)`);
  await server.stop();
}
console.log(JSON.stringify(results));
