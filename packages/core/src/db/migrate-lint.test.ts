import { existsSync, readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, test } from "vitest";
import { coreMigrationsFolder } from "./migrate.ts";
import { APPLIED_ESCAPES, lintMigration } from "./migrate-lint.ts";

// Every module under apps/ with migrations, found by glob: a new module's are linted too.
const apps = fileURLToPath(new URL("../../../../apps/", import.meta.url));
const folders = [
  coreMigrationsFolder,
  ...readdirSync(apps)
    .map((app) => `${apps}${app}/drizzle`)
    .filter((folder) => existsSync(folder)),
];
const files = folders.flatMap((folder) =>
  readdirSync(folder)
    .filter((name) => name.endsWith(".sql"))
    .map((name) => ({ name, text: readFileSync(`${folder}/${name}`, "utf8") })),
);

describe("migration lint: no long write-blocking lock on fences or dead letters", () => {
  test("no SQL migration takes a long write-blocking lock on core.processed_jobs or core.dead_letters without a documented escape (#9 item 5)", () => {
    expect(files.length).toBeGreaterThan(6);
    expect(files.flatMap((f) => lintMigration(f.name, f.text))).toEqual([]);
  });

  test("the escapes for migrations applied before the lint pin each file's hash: they exist unchanged (#9 item 5)", () => {
    for (const name of Object.keys(APPLIED_ESCAPES)) {
      const file = files.find((f) => f.name === name);
      expect(file, name).toBeDefined();
      // Without the pinned escape the same file is refused: the escape is what lets it through.
      expect(lintMigration(`changed/${name}`, file?.text ?? "").length, name).toBeGreaterThan(0);
    }
  });

  test.each([
    ['CREATE INDEX "x" ON "core"."dead_letters" USING btree ("queue");', /without CONCURRENTLY/],
    ["CREATE UNIQUE INDEX IF NOT EXISTS x ON core.processed_jobs (job_id);", /without CONCURRENTLY/],
    ['DROP INDEX "core"."processed_jobs_expiry_idx";', /DROP INDEX/],
    ['ALTER TABLE "core"."dead_letters" ALTER COLUMN "attempts" TYPE bigint;', /ALTER TABLE/],
    ['ALTER TABLE "core"."processed_jobs" ADD COLUMN "lease" text DEFAULT now()::text NOT NULL;', /ALTER TABLE/],
    ['ALTER TABLE "core"."dead_letters" ADD CONSTRAINT "c" CHECK ("attempts" < 100);', /ALTER TABLE/],
    ["VACUUM FULL core.dead_letters;", /locks/],
    ['CREATE INDEX CONCURRENTLY "x" ON "core"."dead_letters" ("queue");', /transaction/],
  ])("refuses %s (#9 item 5)", (statement, problem) => {
    const [found, ...more] = lintMigration("9999_new.sql", statement);
    expect(more).toEqual([]);
    expect(found?.problem).toMatch(problem);
  });

  test.each([
    '-- softcrum-migrate: no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS "x" ON "core"."dead_letters" ("queue");--> statement-breakpoint\nDROP INDEX CONCURRENTLY IF EXISTS "core"."y";',
    'ALTER TABLE "core"."dead_letters" ADD COLUMN "note" text;',
    'ALTER TABLE "core"."dead_letters" ADD CONSTRAINT "c" CHECK ("attempts" < 100) NOT VALID;--> statement-breakpoint\nALTER TABLE "core"."dead_letters" VALIDATE CONSTRAINT "c";',
    'CREATE TABLE "core"."processed_jobs" ("job_id" uuid);--> statement-breakpoint\nCREATE INDEX "p" ON "core"."processed_jobs" ("job_id");',
    'CREATE INDEX "z" ON "core"."ops_audit" ("at");',
    '-- migration-lint: allow the table is empty in every deployment (checked by the release owner)\nCREATE INDEX "x" ON "core"."dead_letters" ("queue");',
  ])("accepts %s (#9 item 5)", (text) => {
    expect(lintMigration("9999_new.sql", text)).toEqual([]);
  });

  // DROP TRIGGER on the partitioned fence table locks the partitions before
  // the table: with live fence inserts (table, then partition) a deadlock.
  // Migration 0029 met it; its LOCK TABLE first is the form that passes.
  const lockFirst =
    '-- migration-lint: allow metadata only\nLOCK TABLE "core"."processed_jobs" IN ACCESS EXCLUSIVE MODE;--> statement-breakpoint\n';
  const dropTrigger = 'DROP TRIGGER IF EXISTS "t" ON "core"."processed_jobs";';
  test("DROP TRIGGER on the partitioned fence table is refused unless the migration locked the table first", () => {
    const [found, ...more] = lintMigration("9999_new.sql", dropTrigger);
    expect(more).toEqual([]);
    expect(found?.problem).toMatch(/locks its partitions before the table.*LOCK TABLE core\.processed_jobs/);
    expect(lintMigration("9999_new.sql", `${lockFirst}${dropTrigger}`)).toEqual([]);
    // A lock taken after it, or in a file whose statements each commit alone, does not count.
    expect(lintMigration("9999_new.sql", `${dropTrigger}--> statement-breakpoint\n${lockFirst}`)).toHaveLength(1);
    expect(
      lintMigration("9999_new.sql", `-- softcrum-migrate: no-transaction\n${lockFirst}${dropTrigger}`).map(
        (p) => p.problem,
      ),
    ).toEqual([expect.stringMatching(/locks its partitions/)]);
    // A mode weaker than ACCESS EXCLUSIVE lets fence inserts in: it does not count.
    const weak = lockFirst.replace("ACCESS EXCLUSIVE", "ROW EXCLUSIVE");
    expect(lintMigration("9999_new.sql", `${weak}${dropTrigger}`).map((p) => p.problem)).toEqual([
      expect.stringMatching(/locks its partitions/),
    ]);
    expect(
      lintMigration("9999_new.sql", `${lockFirst.replace(" IN ACCESS EXCLUSIVE MODE", "")}${dropTrigger}`),
    ).toEqual([]);
    // A quoted trigger name with a space in it is still read.
    expect(lintMigration("9999_new.sql", 'DROP TRIGGER "my trigger" ON "core"."processed_jobs";')).toHaveLength(1);
    // Not partitioned: the dead letters' table takes its trigger's lock once, in order.
    expect(lintMigration("9999_new.sql", 'DROP TRIGGER "t" ON "core"."dead_letters";')).toEqual([]);
  });

  test("an escape comment without a reason does not count (#9 item 5)", () => {
    const [found] = lintMigration(
      "9999_new.sql",
      '-- migration-lint: allow\nCREATE INDEX "x" ON "core"."dead_letters" ("queue");',
    );
    expect(found?.problem).toMatch(/needs a reason/);
  });
});
