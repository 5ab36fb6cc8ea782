import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { uniqueDatabaseName, useTestDatabase, withDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import { migrate as drizzleMigrate } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import {
  assertMigrated,
  coreMigrations,
  coreMigrationsFolder,
  migrateCore,
  migratePostgres,
  NotMigratedError,
  postgresJsSession,
  readMigrationFolder,
} from "./migrate.ts";

const pg = useTestDatabase("migrate");
const created: string[] = [];
const tags = readMigrationFolder(coreMigrationsFolder).map((f) => f.tag);

/** An empty database on the test server, dropped after the file. */
async function freshDatabase(): Promise<string> {
  const name = uniqueDatabaseName("softcrum_t", "migrate_fresh");
  await pg.sql`create database ${pg.sql(name)}`;
  created.push(name);
  return withDatabase(pg.url, name);
}

async function withClient<T>(url: string, work: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    return await work(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** Today's main: drizzle-orm's migrator over the first six journal entries (0000-0005). */
async function migrateAsMain(url: string): Promise<void> {
  const old = mkdtempSync(join(tmpdir(), "softcrum-migrations-"));
  try {
    cpSync(coreMigrationsFolder, old, { recursive: true });
    const journalPath = join(old, "meta", "_journal.json");
    const journal = JSON.parse(readFileSync(journalPath, "utf8")) as { entries: { tag: string }[] };
    journal.entries = journal.entries.filter((e) => /^000[0-5]_/.test(e.tag));
    writeFileSync(journalPath, JSON.stringify(journal));
    await withClient(url, (sql) =>
      drizzleMigrate(drizzle({ client: sql }), { ...coreMigrations, migrationsFolder: old }),
    );
  } finally {
    rmSync(old, { recursive: true, force: true });
  }
}

afterAll(async () => {
  for (const name of created) await pg.sql`drop database if exists ${pg.sql(name)} with (force)`;
});

describe("migrations as a locked deploy step", () => {
  test("4 migration runs started together on a new database all succeed, and each migration is applied once (#9 item 4)", async () => {
    const url = await freshDatabase();
    const results = await Promise.allSettled([1, 2, 3, 4].map(() => migrateCore(url, { lockPollMs: 20 })));
    expect(results.map((r) => (r.status === "rejected" ? String(r.reason) : "ok"))).toEqual(["ok", "ok", "ok", "ok"]);
    const applied = results.flatMap((r) => (r.status === "fulfilled" ? r.value.applied : []));
    // One run applied everything; the others waited for the lock, then found nothing to do.
    expect(applied.sort()).toEqual([...tags].sort());
    const rows = await withClient(
      url,
      (sql) => sql`select hash, created_at::text as "createdAt" from drizzle.__softcrum_core_migrations order by id`,
    );
    expect(rows.map((r) => Number(r["createdAt"]))).toEqual(
      readMigrationFolder(coreMigrationsFolder).map((f) => f.createdAt),
    );
    await withClient(url, (sql) => assertMigrated(postgresJsSession(sql), [coreMigrations]));
  });

  test("a service's start check refuses a database with pending migrations and names `pnpm db:migrate` (#9 item 4)", async () => {
    const url = await freshDatabase();
    const refused = await withClient(url, (sql) =>
      assertMigrated(postgresJsSession(sql), [coreMigrations]).catch((error: unknown) => error),
    );
    expect(refused).toBeInstanceOf(NotMigratedError);
    expect((refused as NotMigratedError).pending).toEqual(tags);
    expect((refused as Error).message).toContain("pnpm db:migrate");
    // The check itself changes nothing: the database is still empty.
    const schemas = await withClient(
      url,
      (sql) => sql`select nspname from pg_namespace where nspname in ('core', 'drizzle')`,
    );
    expect(schemas).toEqual([]);
  });

  test("a database migrated by drizzle's migrator with today's migrations (0000-0005) gets only the new ones, concurrently built (#9 item 5)", async () => {
    const url = await freshDatabase();
    await migrateAsMain(url);
    const { applied } = await migrateCore(url);
    expect(applied).toEqual(tags.filter((t) => !/^000[0-5]_/.test(t)));
    expect((await migrateCore(url)).applied).toEqual([]);
    const indexes = await withClient(
      url,
      (
        sql,
      ) => sql`select c.relname as name, i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid
        where c.relname like 'dead_letters_pending_%' order by 1`,
    );
    expect(indexes).toEqual([
      { name: "dead_letters_pending_kind_class_idx", valid: true },
      { name: "dead_letters_pending_queue_consumer_idx", valid: true },
      { name: "dead_letters_pending_tenant_idx", valid: true },
    ]);
  });

  test("a no-transaction migration whose concurrent build failed is built again by the next run, not kept INVALID (#9 item 5)", async () => {
    const url = await freshDatabase();
    const folder = mkdtempSync(join(tmpdir(), "softcrum-migrations-"));
    try {
      const set = { migrationsFolder: folder, migrationsSchema: "drizzle", migrationsTable: "__test_migrations" };
      const write = (tags: string[]) =>
        writeFileSync(
          join(folder, "meta", "_journal.json"),
          JSON.stringify({ entries: tags.map((tag, i) => ({ tag, when: 1000 + i })) }),
        );
      cpSync(coreMigrationsFolder, folder, { recursive: true, filter: (src) => !src.endsWith(".sql") });
      writeFileSync(
        join(folder, "a.sql"),
        "create table t (v int);\n--> statement-breakpoint\ninsert into t values (1), (1);",
      );
      writeFileSync(
        join(folder, "b.sql"),
        '-- softcrum-migrate: no-transaction\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "t_v" ON "public"."t" ("v");',
      );
      write(["a", "b"]);
      await expect(migratePostgres(url, set)).rejects.toThrow(/migration b failed/);
      const invalid = await withClient(
        url,
        (sql) =>
          sql`select i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname = 't_v'`,
      );
      expect(invalid).toEqual([{ valid: false }]);
      await withClient(url, (sql) => sql`delete from t where ctid <> (select min(ctid) from t)`);
      expect((await migratePostgres(url, set)).applied).toEqual(["b"]);
      const valid = await withClient(
        url,
        (sql) =>
          sql`select i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname = 't_v'`,
      );
      expect(valid).toEqual([{ valid: true }]);
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
  });

  test("the new migrations do not block dead-letter or fence writes while they wait for a transaction open on dead_letters (#9 item 5)", async () => {
    const url = await freshDatabase();
    await migrateAsMain(url);
    const open = postgres(url, { max: 1, onnotice: () => {} });
    let pendingRun: Promise<unknown> = Promise.resolve();
    const writer = postgres(url, { max: 1, onnotice: () => {}, connection: { lock_timeout: 2000 } });
    const letter = (id: string) =>
      `insert into core.dead_letters (id, queue, consumer, payload, attempts, last_error, error_class)
       values ('${id}', 'q', 'c', '{}', 1, 'boom', 'exhausted')`;
    try {
      // A work transaction that wrote a dead letter and has not committed yet.
      const reserved = await open.reserve();
      await reserved.unsafe("begin");
      await reserved.unsafe(letter("00000000-0000-7000-8000-000000000001"));
      const migrating = migrateCore(url);
      pendingRun = migrating.catch(() => undefined);
      // The index build now waits for that transaction (CONCURRENTLY); a plain CREATE INDEX would too, and
      // every insert after it would queue behind its lock.
      await waitFor(
        () =>
          writer`select 1 from pg_stat_activity
            where query like '%CREATE INDEX CONCURRENTLY%' and wait_event_type = 'Lock' and pid <> pg_backend_pid()`,
      );
      // Meanwhile other jobs write dead letters and fences without waiting on a lock (lock_timeout 2 s).
      await writer.unsafe(letter("00000000-0000-7000-8000-000000000002"));
      await writer`insert into core.processed_jobs (job_id, consumer) values (gen_random_uuid(), 'c')`;
      await reserved.unsafe("commit");
      reserved.release();
      expect((await migrating).applied).toEqual(tags.filter((t) => !/^000[0-5]_/.test(t)));
      const [row] = await writer`select count(*)::int as n from core.dead_letters where status = 'pending_review'`;
      expect(row?.["n"]).toBe(2);
    } finally {
      await open.end({ timeout: 5 }); // ends the open transaction, if a failure left it open
      await pendingRun;
      await writer.end({ timeout: 5 });
    }
  });
});

/** Polls a condition on the database (a state to reach, not a time to wait). */
async function waitFor(check: () => Promise<readonly unknown[]>): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await check()).length > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error("the condition was not reached in 5 s");
}
