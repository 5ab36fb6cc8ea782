/**
 * Migration 0026 takes an existing, unpartitioned core.processed_jobs over
 * (#23 item 4, ADR 0014) while consumers keep writing fences: no fence is
 * lost, no live delivery fails, every copy of a job stays a duplicate, and
 * the first day partitions exist afterwards. Real Postgres, real consumers
 * on their own pool, the real deploy step.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { uniqueDatabaseName, useTestDatabase, withDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeEach, describe, expect, test } from "vitest";
import { awayFromDayEdges, dbDay, fenceHome, fencePartitions, jobsOf } from "../../test/fence-days.ts";
import { createEffectsTable, effectConsumer, silentLogger } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";
import {
  coreMigrationsFolder,
  type MigrationSet,
  migrateCore,
  migratePostgres,
  postgresJsSession,
  readMigrationFolder,
} from "../db/migrate.ts";
import { createEnvelope } from "../envelope.ts";

const pg = useTestDatabase("fence_takeover");
const created: string[] = [];
const folders: string[] = [];
const TAKEOVER = "0026_partitioned_fence";

afterAll(async () => {
  for (const name of created) await pg.sql`drop database if exists ${pg.sql(name)} with (force)`;
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

/** The core's migrations as they were before the takeover. */
function before0026(): MigrationSet {
  const folder = mkdtempSync(join(tmpdir(), "softcrum-before-0026-"));
  folders.push(folder);
  cpSync(coreMigrationsFolder, folder, { recursive: true });
  const path = join(folder, "meta", "_journal.json");
  const journal = JSON.parse(readFileSync(path, "utf8")) as { entries: { tag: string }[] };
  const at = journal.entries.findIndex((e) => e.tag === TAKEOVER);
  expect(at).toBeGreaterThan(0);
  journal.entries = journal.entries.slice(0, at);
  writeFileSync(path, JSON.stringify(journal));
  return { migrationsFolder: folder, migrationsSchema: "drizzle", migrationsTable: "__softcrum_core_migrations" };
}

/** The core's migration tags from `tag` on, in order. */
function tagsFrom(tag: string): string[] {
  const journal = JSON.parse(readFileSync(join(coreMigrationsFolder, "meta", "_journal.json"), "utf8")) as {
    entries: { tag: string }[];
  };
  const tags = journal.entries.map((e) => e.tag);
  return tags.slice(tags.indexOf(tag));
}

const live = effectConsumer("takeover.live");
const award = (jobId?: string) =>
  JSON.stringify(
    createEnvelope({
      ...(jobId ? { jobId } : {}),
      tenantId: "t",
      kind: "points.award.v1",
      data: { customerId: "c", points: 1 },
    }),
  );

// The takeover creates the days ahead from the database's clock, and the tests read "today" beside it.
beforeEach(() => awayFromDayEdges(pg.sql));

describe("migration 0026 takes the fence over (#23 item 4)", () => {
  test("an unpartitioned fence table with rows becomes the default partition while consumers write: none lost, none failed, copies stay duplicates", async () => {
    const name = uniqueDatabaseName("softcrum_t", "fence_takeover");
    await pg.sql`create database ${pg.sql(name)}`;
    created.push(name);
    const url = withDatabase(pg.url, name);
    await migratePostgres(url, before0026());
    const sql = postgres(url, { max: 4, onnotice: () => {} });
    const pool = postgres(url, { max: 8, onnotice: () => {} });
    try {
      await createEffectsTable(sql);
      // 60,000 fences over the last ten days (half of them the live consumer's), and
      // ten from a producer whose clock ran three days ahead.
      await sql`
        insert into core.processed_jobs (job_id, consumer, processed_at)
        select (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
               case when n % 2 = 0 then ${live.name} else 'legacy.other' end,
               to_timestamp(ms / 1000.0)
        from generate_series(1, 60000) n,
             lateral (select (extract(epoch from now()) * 1000)::bigint - n::bigint * 14400 as ms, md5(n::text) as h) x`;
      const skewedDay = await dbDay(sql, 3);
      const skewed = jobsOf(skewedDay, 10);
      await sql`insert into core.processed_jobs (job_id, consumer) select unnest(${skewed}::uuid[]), ${live.name}`;
      await sql`create table legacy_copy as select * from core.processed_jobs`;
      const [{ oid: legacyOid } = { oid: "" }] = await sql<{ oid: string }[]>`
        select 'core.processed_jobs'::regclass::oid::text as oid`;
      const legacyLive = (
        await sql<{ job_id: string }[]>`select job_id from legacy_copy where consumer = ${live.name} limit 200`
      ).map((r) => r.job_id);

      // Consumers at work: new jobs, and copies of jobs done before the migration.
      const bound = bindConsumer(live, { db: drizzle({ client: pool }), logger: silentLogger });
      const outcomes = { fresh: [] as string[], copies: [] as string[] };
      const fresh: string[] = [];
      let slowest = 0;
      let stop = false;
      let migrating = false;
      let duringMigration = 0;
      const loops = Array.from({ length: 6 }, async (_, worker) => {
        for (let i = 0; !stop; i++) {
          const copy = worker === 0;
          const jobId = copy ? legacyLive[i % legacyLive.length] : undefined;
          const body = award(jobId);
          const started = performance.now();
          const result = await bound.deliver({ body, deliveryCount: 1 });
          slowest = Math.max(slowest, performance.now() - started);
          if (migrating) duringMigration += 1;
          (copy ? outcomes.copies : outcomes.fresh).push(result.outcome);
          if (!copy && result.outcome === "success") fresh.push(JSON.parse(body).job_id);
        }
      });
      await new Promise((resolve) => setTimeout(resolve, 300));
      // A long job holds its fence (and so the table) when the deploy starts:
      // the takeover gives way after its lock timeout and is tried again.
      const longJob = bindConsumer(
        effectConsumer("takeover.long", () => new Promise((resolve) => setTimeout(resolve, 1_500))),
        { db: drizzle({ client: pool }), logger: silentLogger },
      ).deliver({ body: award(), deliveryCount: 1 });
      await new Promise((resolve) => setTimeout(resolve, 100));
      migrating = true;
      const { applied } = await migrateCore(url);
      migrating = false;
      expect((await longJob).outcome).toBe("success");
      await new Promise((resolve) => setTimeout(resolve, 300));
      stop = true;
      await Promise.all(loops);

      // The takeover, then whatever came after it.
      expect(applied).toEqual(tagsFrom(TAKEOVER));
      expect(duringMigration).toBeGreaterThan(0);
      expect(new Set(outcomes.fresh)).toEqual(new Set(["success"]));
      expect(new Set(outcomes.copies)).toEqual(new Set(["duplicate"]));
      // A fence insert waited at most for the runner's lock timeout (500 ms) per try.
      expect(slowest).toBeLessThan(5_000);

      const [shape] = await sql<{ kind: string; defaultOid: string }[]>`
        select (select relkind::text from pg_class where oid = 'core.processed_jobs'::regclass) as kind,
               'core.processed_jobs_default'::regclass::oid::text as "defaultOid"`;
      // The table itself became the default partition: nothing was copied.
      expect(shape).toEqual({ kind: "p", defaultOid: legacyOid });
      const [counts] = await sql<{ lost: number; fences: number; effects: number }[]>`
        select (select count(*)::int from legacy_copy l where not exists (
                  select 1 from core.processed_jobs p where p.job_id = l.job_id and p.consumer = l.consumer)) as lost,
               (select count(*)::int from core.processed_jobs) as fences,
               (select count(*)::int from test_effects) as effects`;
      // Every fence of before, every live success's, and the long job's.
      expect(counts).toEqual({ lost: 0, fences: 60_010 + fresh.length + 1, effects: fresh.length + 1 });

      // Every fence still refuses a second one, before and after the takeover.
      for (const id of [...legacyLive.slice(0, 20), ...fresh.slice(-20), ...skewed.slice(0, 3)]) {
        const again = await sql`insert into core.processed_jobs (job_id, consumer) values (${id}, ${live.name})
          on conflict do nothing returning 1`;
        expect(again).toHaveLength(0);
      }
      expect((await bound.deliver({ body: award(fresh[0]), deliveryCount: 2 })).outcome).toBe("duplicate");
      // The first week of day partitions, but not the day the default partition already had fences of.
      const days = await fencePartitions(sql);
      expect(days).toContain(await dbDay(sql, 7));
      expect(days).not.toContain(skewedDay);
      expect(await fenceHome(sql, skewed[0] as string, live.name)).toBe("processed_jobs_default");
      const [grants] = await sql<{ worker: boolean; reader: boolean }[]>`
        select has_table_privilege('softcrum_worker', 'core.processed_jobs', 'INSERT, DELETE') as worker,
               has_table_privilege('softcrum_ops_reader', 'core.processed_jobs', 'SELECT') as reader`;
      expect(grants).toEqual({ worker: true, reader: true });

      // Run again statement by statement (an interrupted deploy), it changes nothing.
      const file = readMigrationFolder(coreMigrationsFolder).find((f) => f.tag === TAKEOVER);
      const session = postgresJsSession(sql);
      const partitionsBefore = await fencePartitions(sql);
      for (const statement of file?.statements ?? []) await session.run(statement);
      expect(await fencePartitions(sql)).toEqual(partitionsBefore);
      const [after] = await sql<{ n: number }[]>`select count(*)::int as n from core.processed_jobs`;
      expect(after?.n).toBe(counts?.fences);
    } finally {
      await pool.end({ timeout: 5 });
      await sql.end({ timeout: 5 });
    }
  });
});
