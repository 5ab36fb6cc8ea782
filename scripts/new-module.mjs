#!/usr/bin/env node
// `pnpm new:module <name> [--no-install]`: scaffolds apps/<name>, a Softcrum
// module (`@softcrum/module-<name>`) built on @softcrum/core's public API
// only: a Drizzle schema and its first migration, the migration set, one
// consumer, a composition root, and tests on a real Postgres. Then it runs
// `pnpm install` so the workspace links the new package (unless
// --no-install). A bad name is one line on stderr and exit code 2.
//
// The first migration is written here, as drizzle-kit 0.31 would generate it
// (`drizzle-kit generate --name <schema>_events`): the same SQL, snapshot and
// journal, so the module's next `pnpm db:generate` diffs against it and
// finds no change until src/schema.ts changes.
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const APPS = join(ROOT, "apps");
const USAGE = "usage: pnpm new:module <name> [--no-install]";
/** `__<name>_migrations` and the schema name stay within Postgres's 63-character identifiers. */
const MAX_NAME = 40;
/** Schemas that already have an owner in every module's database (or that Postgres reserves). */
const RESERVED = new Set(["core", "drizzle", "public", "information_schema"]);

/** One line on stderr, exit code 2: what is wrong and what to do. */
function refuse(message) {
  process.stderr.write(`new:module: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  let name;
  let install = true;
  for (const arg of argv) {
    if (arg === "--no-install") install = false;
    else if (arg === "--help" || arg === "-h") {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else if (arg.startsWith("-")) refuse(`unknown option ${JSON.stringify(arg)} (${USAGE})`);
    else if (name !== undefined)
      refuse(`one name only, got ${JSON.stringify(name)} and ${JSON.stringify(arg)} (${USAGE})`);
    else name = arg;
  }
  if (name === undefined) refuse(`give the module's name, e.g. pnpm new:module rewards (${USAGE})`);
  return { name, install };
}

function readJson(file) {
  return JSON.parse(readFileSync(file, "utf8"));
}

/** The workspace's apps: folder name and package name. */
function existingApps() {
  if (!existsSync(APPS)) return [];
  return readdirSync(APPS, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => {
      const manifest = join(APPS, entry.name, "package.json");
      return { dir: entry.name, pkg: existsSync(manifest) ? readJson(manifest).name : undefined };
    })
    .sort((a, b) => a.dir.localeCompare(b.dir));
}

function validate(name) {
  if (!/^[a-z][a-z0-9]*(-[a-z0-9]+)*$/.test(name)) {
    refuse(
      `${JSON.stringify(name)} is not a valid module name: use lowercase letters, digits and single dashes, starting with a letter (e.g. rewards, gift-cards)`,
    );
  }
  if (name.length > MAX_NAME) refuse(`${JSON.stringify(name)} is too long: at most ${MAX_NAME} characters`);
  const schema = name.replaceAll("-", "_");
  if (RESERVED.has(schema) || schema.startsWith("pg_")) {
    refuse(
      `${JSON.stringify(name)} is reserved: its Postgres schema ${JSON.stringify(schema)} belongs to the core or to Postgres`,
    );
  }
  const pkg = `@softcrum/module-${name}`;
  for (const app of existingApps()) {
    if (app.dir === name) refuse(`apps/${name} already exists: choose another name`);
    if (app.pkg === pkg) refuse(`apps/${app.dir} is already the package ${pkg}: choose another name`);
    if (app.dir.replaceAll("-", "_") === schema) {
      refuse(`apps/${app.dir} already owns the Postgres schema ${JSON.stringify(schema)}: choose another name`);
    }
  }
}

/**
 * The versions to pin: what the other apps use (one version across the
 * workspace, nothing new for the lockfile), else @softcrum/core's own
 * devDependencies (the versions it is tested against), else the root's.
 */
function versions(names) {
  const sources = [
    ...existingApps().map((app) => join(APPS, app.dir, "package.json")),
    join(ROOT, "packages", "core", "package.json"),
    join(ROOT, "package.json"),
  ].filter((file) => existsSync(file));
  const found = {};
  for (const dep of names) {
    for (const file of sources) {
      const manifest = readJson(file);
      const version = manifest.dependencies?.[dep] ?? manifest.devDependencies?.[dep];
      if (version && !version.startsWith("workspace:")) {
        found[dep] = version;
        break;
      }
    }
    if (!found[dep]) refuse(`no version of ${dep} found in apps/*/package.json, packages/core or the root to pin`);
  }
  return found;
}

const camel = (name) => name.replace(/-([a-z0-9])/g, (_, c) => c.toUpperCase());
const pascal = (name) => camel(name).replace(/^[a-z]/, (c) => c.toUpperCase());

/** Every file of the new module, by path inside apps/<name>. */
function moduleFiles(name) {
  const schema = name.replaceAll("-", "_");
  const id = camel(name);
  const Id = pascal(name);
  const pkg = `@softcrum/module-${name}`;
  const migrations = `${id}Migrations`;
  const consumerName = `${name}.record-event`;
  const queue = `${name}.events`;
  const kind = `${name}.record-event.v1`;
  const tag = `0000_${schema}_events`;
  const pins = versions([
    "@electric-sql/pglite",
    "drizzle-orm",
    "postgres",
    "zod",
    "@types/node",
    "drizzle-kit",
    "tsx",
    "typescript",
    "vitest",
  ]);
  const pick = (deps) => Object.fromEntries(deps.map((dep) => [dep, pins[dep]]));

  const packageJson = {
    name: pkg,
    version: "0.0.0",
    private: true,
    description: `Softcrum module ${name}: its consumers, schema (Postgres schema ${schema}) and migrations.`,
    type: "module",
    scripts: {
      "db:migrate": "tsx src/migrate-cli.ts",
      "db:generate": "drizzle-kit generate --config drizzle.config.ts",
      typecheck: "tsc -p tsconfig.json",
      test: "vitest run",
    },
    dependencies: {
      ...pick(["@electric-sql/pglite"]),
      "@softcrum/core": "workspace:*",
      ...pick(["drizzle-orm", "postgres", "zod"]),
    },
    devDependencies: pick(["@types/node", "drizzle-kit", "tsx", "typescript", "vitest"]),
    exports: {
      "./composition-root": "./src/composition-root.ts",
      "./migrations": "./src/migrations.ts",
    },
  };

  const tsconfig = `{
  "extends": "../../tsconfig.base.json",
  "include": ["src", "test", "*.ts"]
}
`;

  const drizzleConfig = `import { defineConfig } from "drizzle-kit";

// The module's own migrations (\`pnpm db:generate\` after changing src/schema.ts), kept apart from @softcrum/core's.
export default defineConfig({
  dialect: "postgresql",
  schema: "./src/schema.ts",
  out: "./drizzle",
  schemaFilter: ["${schema}"],
});
`;

  const vitestConfig = `import { defineProject } from "vitest/config";

export default defineProject({
  test: {
    name: "${name}",
    include: ["src/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["./test/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
`;

  const schemaTs = `import { bigserial, integer, pgSchema, text, timestamp, uuid } from "drizzle-orm/pg-core";

/** The module owns the \`${schema}\` schema; @softcrum/core owns \`core\`. */
export const ${id}Schema = pgSchema("${schema}");

/** One row per recorded event: the effect that a retry or a duplicate delivery must never repeat. */
export const events = ${id}Schema.table("events", {
  id: bigserial("id", { mode: "number" }).primaryKey(),
  jobId: uuid("job_id").notNull(),
  tenantId: text("tenant_id").notNull(),
  /** The harness's key for (job, consumer): unique, a second guard behind the fence. */
  idempotencyKey: text("idempotency_key").notNull().unique(),
  subject: text("subject").notNull(),
  amount: integer("amount").notNull(),
  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
});
`;

  const migrationsTs = `import { fileURLToPath } from "node:url";
import type { MigrationSet } from "@softcrum/core/migrate";

/** The module's migrations (drizzle/), recorded in drizzle.__${schema}_migrations, apart from the core's. */
export const ${migrations}: MigrationSet = {
  migrationsFolder: fileURLToPath(new URL("../drizzle", import.meta.url)),
  migrationsSchema: "drizzle",
  migrationsTable: "__${schema}_migrations",
};
`;

  const migrateCli = `// \`pnpm db:migrate\`: the core's migrations, then this module's, on $DATABASE_URL, under the migration lock.
// A deploy step: services never migrate at start (createModule refuses a database behind the code).
import { runModuleMigrationsCli } from "@softcrum/core/module";
import { ${migrations} } from "./migrations.ts";

await runModuleMigrationsCli("${name}", ${migrations});
`;

  const consumerTs = `import { createEnvelope, defineConsumer, type Envelope } from "@softcrum/core";
import { z } from "zod";
import { events } from "./schema.ts";

export const RECORD_EVENT_QUEUE = "${queue}";
/** The job's kind, its version included: a changed data shape is a new kind (\`…v2\`). */
export const RECORD_EVENT_KIND = "${kind}";

/** A job's data. Data that fails it is poison: dead-lettered at once, never retried. */
export const recordEventData = z.object({
  subject: z.string().min(1).max(200),
  amount: z.number().int().min(0).max(1_000_000),
});
export type RecordEvent = z.infer<typeof recordEventData>;

/**
 * Records one event per job. Every write goes through \`tx\`: it commits
 * together with the job's fence, so a retry or a duplicate delivery never
 * writes twice. Throw to fail: \`PermanentError\` dead-letters at once,
 * \`RateLimitedError\` waits without spending an attempt, anything else retries.
 */
export const recordEvent = defineConsumer({
  name: "${consumerName}",
  queue: RECORD_EVENT_QUEUE,
  kind: RECORD_EVENT_KIND,
  schema: recordEventData,
  async handle(data, { tx, envelope, idempotencyKey }) {
    await tx.insert(events).values({
      jobId: envelope.job_id,
      tenantId: envelope.tenant_id,
      idempotencyKey,
      subject: data.subject,
      amount: data.amount,
    });
  },
});

/** A job for this consumer (a fresh job_id): publish it to RECORD_EVENT_QUEUE. */
export function recordEventJob(tenantId: string, data: RecordEvent): Envelope<RecordEvent> {
  return createEnvelope({ tenantId, kind: RECORD_EVENT_KIND, data });
}
`;

  const compositionRoot = `// The ${name} module's composition root. DATABASE_URL: a Postgres migrated with \`pnpm db:migrate\`
// (one behind the code is refused); unset: an embedded PGlite, migrated at start.
// SOFTCRUM_QUEUE picks the transport: "memory" (the default) or "vercel".
import { createModule, fromEnv } from "@softcrum/core/module";
import { ${migrations} } from "./migrations.ts";
import { recordEvent } from "./record-event.ts";

export function create${Id}Module(options: { readonly db?: string } = {}) {
  return createModule({
    name: "${name}",
    consumers: [recordEvent],
    migrations: ${migrations},
    db: options.db,
    transport: fromEnv(),
  });
}
`;

  const globalSetup = `import { moduleGlobalSetup } from "@softcrum/core/testing";
import { ${migrations} } from "../src/migrations.ts";

// A template database, migrated once per run (the core's migrations, then this module's); each test file
// copies it. Postgres: TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432.
export default moduleGlobalSetup({ name: "${name}", migrations: [${migrations}] });
`;

  const consumerTest = `import { bindConsumer, createEnvelope, defineConsumer } from "@softcrum/core";
import {
  createManualClock,
  createTestQueue,
  deadLettersOf,
  expectOneEffect,
  fenceOf,
  useModuleDatabase,
} from "@softcrum/core/testing";
import { eq } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { create${Id}Module } from "./composition-root.ts";
import { RECORD_EVENT_KIND, RECORD_EVENT_QUEUE, recordEvent, recordEventJob } from "./record-event.ts";
import { events } from "./schema.ts";

// This file's own database on the Postgres the global setup found, copied from the migrated template.
const pg = useModuleDatabase();
const quiet = { warn: () => {}, error: () => {} };

/** The consumer bound to the test database on a manual clock: a whole backoff takes no real time. */
function testQueue(consumer = recordEvent) {
  const clock = createManualClock(Date.parse("2030-01-01T00:00:00Z"));
  // random: () => 0 fixes the retry jitter at its least.
  const bound = bindConsumer(consumer, { db: pg.db, now: clock.now, random: () => 0, logger: quiet });
  return createTestQueue({ clock, consumers: [bound] });
}

describe("${consumerName}", () => {
  test("a job and its duplicate: one row, with the idempotency key, and one fence", async () => {
    const t = testQueue();
    const job = recordEventJob("acme", { subject: "signup", amount: 10 });
    const report = await t.deliverTwice(job);
    expect(report.outcomes).toEqual(["success", "duplicate"]);
    const row = await expectOneEffect(pg.db, events, { jobId: job.job_id });
    expect(row).toMatchObject({ tenantId: "acme", subject: "signup", amount: 10, idempotencyKey: expect.any(String) });
    expect(await fenceOf(pg.db, job.job_id, recordEvent.name)).toMatchObject({ jobId: job.job_id });
    await t.close();
  });

  test("a bad payload is poison: dead-lettered at once, never retried, no row", async () => {
    const t = testQueue();
    const job = createEnvelope({ tenantId: "acme", kind: RECORD_EVENT_KIND, data: { subject: "", amount: 1.5 } });
    await t.publish(job);
    expect((await t.drain()).outcomes).toEqual(["poison"]);
    expect(await deadLettersOf(pg.db, job.job_id)).toEqual([
      expect.objectContaining({ consumer: recordEvent.name, errorClass: "poison", status: "pending_review" }),
    ]);
    expect(await pg.db.select().from(events).where(eq(events.jobId, job.job_id))).toEqual([]);
    await t.close();
  });

  test("a transient failure is retried through the backoff, then one row", async () => {
    // The real handler, after a first attempt that fails as a dropped connection would.
    const flaky = defineConsumer({
      ...recordEvent,
      async handle(data, ctx) {
        if (ctx.attempt === 1) throw new Error("connection reset by peer");
        await recordEvent.handle(data, ctx);
      },
    });
    const t = testQueue(flaky);
    const job = recordEventJob("acme", { subject: "purchase", amount: 3 });
    await t.publish(job);
    const report = await t.drain();
    expect(report.outcomes).toEqual(["retry", "success"]);
    expect(report.elapsedMs).toBeGreaterThan(0); // the backoff, in clock time only
    await expectOneEffect(pg.db, events, { jobId: job.job_id });
    expect(await deadLettersOf(pg.db, job.job_id)).toEqual([]);
    await t.close();
  });
});

test("the composition root starts on the migrated database and runs a published job", async () => {
  const mod = await create${Id}Module({ db: pg.url });
  try {
    if (mod.transport !== "memory") throw new Error("expected the in-process transport: SOFTCRUM_QUEUE is set");
    const job = recordEventJob("acme", { subject: "wired", amount: 1 });
    await mod.queue.publish(RECORD_EVENT_QUEUE, job);
    await mod.settle();
    await expectOneEffect(mod.db, events, { jobId: job.job_id });
  } finally {
    await mod.close();
  }
});
`;

  const sql = `CREATE SCHEMA "${schema}";
--> statement-breakpoint
CREATE TABLE "${schema}"."events" (
\t"id" bigserial PRIMARY KEY NOT NULL,
\t"job_id" uuid NOT NULL,
\t"tenant_id" text NOT NULL,
\t"idempotency_key" text NOT NULL,
\t"subject" text NOT NULL,
\t"amount" integer NOT NULL,
\t"created_at" timestamp with time zone DEFAULT now() NOT NULL,
\tCONSTRAINT "events_idempotency_key_unique" UNIQUE("idempotency_key")
);
`;

  const column = (columnName, type, extra = {}) => ({
    name: columnName,
    type,
    primaryKey: columnName === "id",
    notNull: true,
    ...extra,
  });
  const snapshot = {
    id: randomUUID(),
    prevId: "00000000-0000-0000-0000-000000000000",
    version: "7",
    dialect: "postgresql",
    tables: {
      [`${schema}.events`]: {
        name: "events",
        schema,
        columns: {
          id: column("id", "bigserial"),
          job_id: column("job_id", "uuid"),
          tenant_id: column("tenant_id", "text"),
          idempotency_key: column("idempotency_key", "text"),
          subject: column("subject", "text"),
          amount: column("amount", "integer"),
          created_at: column("created_at", "timestamp with time zone", { default: "now()" }),
        },
        indexes: {},
        foreignKeys: {},
        compositePrimaryKeys: {},
        uniqueConstraints: {
          events_idempotency_key_unique: {
            name: "events_idempotency_key_unique",
            nullsNotDistinct: false,
            columns: ["idempotency_key"],
          },
        },
        policies: {},
        checkConstraints: {},
        isRLSEnabled: false,
      },
    },
    enums: {},
    schemas: { [schema]: schema },
    sequences: {},
    roles: {},
    policies: {},
    views: {},
    _meta: { columns: {}, schemas: {}, tables: {} },
  };
  const journal = {
    version: "7",
    dialect: "postgresql",
    entries: [{ idx: 0, version: "7", when: Date.now(), tag, breakpoints: true }],
  };

  const json = (value) => `${JSON.stringify(value, null, 2)}\n`;
  return {
    "package.json": json(packageJson),
    "tsconfig.json": tsconfig,
    "drizzle.config.ts": drizzleConfig,
    "vitest.config.ts": vitestConfig,
    [`drizzle/${tag}.sql`]: sql,
    // drizzle-kit writes its meta files without a final newline.
    "drizzle/meta/_journal.json": JSON.stringify(journal, null, 2),
    "drizzle/meta/0000_snapshot.json": JSON.stringify(snapshot, null, 2),
    "src/schema.ts": schemaTs,
    "src/migrations.ts": migrationsTs,
    "src/migrate-cli.ts": migrateCli,
    "src/record-event.ts": consumerTs,
    "src/composition-root.ts": compositionRoot,
    "src/record-event.test.ts": consumerTest,
    "test/global-setup.ts": globalSetup,
  };
}

function main() {
  const { name, install } = parseArgs(process.argv.slice(2));
  validate(name);
  const files = moduleFiles(name);
  const dir = join(APPS, name);
  mkdirSync(APPS, { recursive: true });
  try {
    mkdirSync(dir); // not recursive: a folder made meanwhile is refused, never written into
  } catch (error) {
    if (error.code === "EEXIST") refuse(`apps/${name} already exists: choose another name`);
    throw error;
  }
  try {
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text, { flag: "wx" });
    }
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }

  const pkg = `@softcrum/module-${name}`;
  const where = relative(process.cwd(), dir) || ".";
  const lines = [`Made apps/${name} (${pkg}):`, ...Object.keys(files).map((path) => `  apps/${name}/${path}`)];
  process.stdout.write(`${lines.join("\n")}\n`);

  if (install) {
    process.stdout.write("\nLinking it into the workspace: pnpm install --no-frozen-lockfile\n");
    // The new package must enter the lockfile; under CI=true pnpm would otherwise refuse (frozen lockfile).
    const result = spawnSync("pnpm", ["install", "--no-frozen-lockfile"], { cwd: ROOT, stdio: "inherit" });
    if (result.status !== 0) {
      process.stderr.write(
        `new:module: pnpm install failed (${result.error?.message ?? `exit code ${result.status}`}); ${where} is written: fix the install, then run pnpm install\n`,
      );
      process.exit(1);
    }
  }

  const steps = [
    ...(install ? [] : [["pnpm install", "link the new package first (skipped: --no-install)"]]),
    [`pnpm --filter ${pkg} test`, "its tests, on Postgres at 127.0.0.1:5432 or TEST_DATABASE_URL"],
    [`pnpm --filter ${pkg} typecheck`, ""],
    [
      `DATABASE_URL=postgres://USER@HOST:5432/YOUR_DATABASE pnpm --filter ${pkg} db:migrate`,
      "on a database of your own: the core's tables, then this module's",
    ],
    [`pnpm --filter ${pkg} db:generate`, "after changing src/schema.ts: the next migration in drizzle/"],
  ];
  const next = [
    "",
    "Next:",
    ...steps.flatMap(([command, why]) => [`  ${command}`, ...(why ? [`      # ${why}`] : [])]),
  ];
  process.stdout.write(`${next.join("\n")}\n`);
}

main();
