import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runScript, uniqueDatabaseName, useTestDatabase, withDatabase } from "@softcrum/testing";
import { integer, pgSchema, text, uuid } from "drizzle-orm/pg-core";
import postgres from "postgres";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { startFakeVercelQueues } from "../../test/fake-vercel-queues.ts";
import { silentLogger } from "../../test/fixtures.ts";
import { toVercelTopic } from "../adapters/vercel/index.ts";
import { createManualClock } from "../clock.ts";
import { type Consumer, defineConsumer } from "../consumer.ts";
import { coreMigrations, type MigrationSet, NotMigratedError } from "../db/migrate.ts";
import { createEnvelope } from "../envelope.ts";
import { InvalidConfigError, isSoftcrumError } from "../errors.ts";
import { chooseDatabase } from "./database.ts";
import {
  createModule,
  DuplicateConsumerError,
  fromEnv,
  memory,
  migrateModule,
  UnknownConsumerError,
  vercel,
} from "./index.ts";

const pg = useTestDatabase("module");
const created: string[] = [];
let folder: string;
let moduleMigrations: MigrationSet;

/** The test module's own table, made by its own migration set. */
const effects = pgSchema("module_test").table("effects", {
  jobId: uuid("job_id").notNull(),
  consumer: text("consumer").notNull(),
  amount: integer("amount").notNull(),
});

const NOTIFY_QUEUE = "module-test.notify";
const data = z.object({ points: z.number().int() });

/** Credits (one effect row) and writes a notification to the outbox in the same transaction. */
const award = defineConsumer({
  name: "module-test.award",
  queue: "module-test.award",
  kind: "test.award.v1",
  schema: data,
  async handle(job, { tx, envelope, outbox }) {
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "module-test.award", amount: job.points });
    await outbox.publish(
      NOTIFY_QUEUE,
      createEnvelope({ tenantId: envelope.tenant_id, kind: "test.notify.v1", data: { points: job.points } }),
    );
  },
});

const notify = defineConsumer({
  name: "module-test.notify",
  queue: NOTIFY_QUEUE,
  kind: "test.notify.v1",
  schema: data,
  async handle(job, { tx, envelope }) {
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "module-test.notify", amount: job.points });
  },
});

const job = (points: number, kind = "test.award.v1") => createEnvelope({ tenantId: "acme", kind, data: { points } });

async function effectRows(consumer: string) {
  return pg.sql<{ jobId: string; amount: number }[]>`
    select job_id as "jobId", amount from module_test.effects where consumer = ${consumer}`;
}

/** An empty database on the test server, dropped after the file. */
async function freshDatabase(): Promise<string> {
  const name = uniqueDatabaseName("softcrum_t", "module_fresh");
  await pg.sql`create database ${pg.sql(name)}`;
  created.push(name);
  return withDatabase(pg.url, name);
}

beforeAll(async () => {
  folder = mkdtempSync(join(tmpdir(), "softcrum-module-migrations-"));
  mkdirSync(join(folder, "meta"));
  writeFileSync(
    join(folder, "meta", "_journal.json"),
    JSON.stringify({ entries: [{ tag: "0000_module_effects", when: 1_800_000_000_000 }] }),
  );
  writeFileSync(
    join(folder, "0000_module_effects.sql"),
    'CREATE SCHEMA IF NOT EXISTS "module_test";\n--> statement-breakpoint\n' +
      'CREATE TABLE "module_test"."effects" ("job_id" uuid NOT NULL, "consumer" text NOT NULL, "amount" integer NOT NULL);\n',
  );
  moduleMigrations = {
    migrationsFolder: folder,
    migrationsSchema: "drizzle",
    migrationsTable: "__module_test_migrations",
  };
  // The test database holds the core's migrations (the template); the deploy step adds the module's.
  await migrateModule(pg.url, moduleMigrations);
});

beforeEach(async () => {
  await pg.sql`truncate module_test.effects, core.processed_jobs, core.dead_letters, core.outbox cascade`;
});

afterAll(async () => {
  rmSync(folder, { recursive: true, force: true });
  for (const name of created) await pg.sql`drop database if exists ${pg.sql(name)} with (force)`;
});

describe("createModule on the in-process transport", () => {
  test("a job and its duplicate make one effect; what it wrote to the outbox is relayed and run; versions are reported", async () => {
    const mod = await createModule({
      name: "module-test",
      consumers: [award, notify],
      migrations: moduleMigrations,
      db: pg.url,
      transport: memory({ concurrency: 2 }),
      outbox: true,
      logger: silentLogger,
      version: "build-42",
    });
    try {
      expect(mod.transport).toBe("memory");
      expect(mod.database).toBe("postgres");
      expect(Object.keys(mod.consumers).sort()).toEqual([award.name, notify.name]);
      expect(mod.consumer(award.name)).toBe(mod.consumers[award.name]);
      const credit = job(25);
      await mod.queue.publish(award.queue, credit);
      await mod.queue.publish(award.queue, credit); // a duplicate
      await mod.settle();
      expect(await effectRows(award.name)).toEqual([{ jobId: credit.job_id, amount: 25 }]);
      expect((await effectRows(notify.name)).map((r) => r.amount)).toEqual([25]);
      const versions = await pg.sql<{ consumer: string; version: string; kinds: string[] }[]>`
        select consumer, version, kinds from core.consumer_versions where consumer like 'module-test.%' order by consumer`;
      expect(versions).toEqual([
        { consumer: award.name, version: "build-42", kinds: ["test.award.v1"] },
        { consumer: notify.name, version: "build-42", kinds: ["test.notify.v1"] },
      ]);
      expect(() => mod.consumer("module-test.nope")).toThrow(UnknownConsumerError);
    } finally {
      await mod.close();
      await mod.close(); // twice is fine
    }
  });

  test("one manual clock for queue and harness: a retry comes back when the clock says, and the harness ages the job by it", async () => {
    const clock = createManualClock();
    const seen: { attempt: number; at: number }[] = [];
    const retry = { maxAttempts: 3, baseDelayMs: 60_000, maxDelayMs: 600_000 };
    const flaky = defineConsumer({
      name: "module-test.flaky",
      queue: "module-test.flaky",
      kind: "test.award.v1",
      schema: data,
      retry,
      async handle(job, { tx, envelope, attempt }) {
        seen.push({ attempt, at: clock.now() });
        if (attempt === 1) throw new Error("the provider blinked");
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "module-test.flaky", amount: job.points });
      },
    });
    // Fails once; its retry comes 30-60 s of clock time later, past its 20 s maximum age.
    const stale = defineConsumer({
      name: "module-test.stale",
      queue: "module-test.stale",
      kind: "test.award.v1",
      schema: data,
      retry,
      maxAgeMs: 20_000,
      async handle() {
        throw new Error("always down");
      },
    });
    // The clock given to the transport only: it is the module's clock, the harness's too.
    const mod = await createModule({
      name: "module-test",
      consumers: [flaky, stale],
      migrations: moduleMigrations,
      db: pg.url,
      transport: memory({ clock }),
      logger: silentLogger,
    });
    try {
      expect(mod.clock).toBe(clock);
      const started = Date.now();
      const first = job(7);
      const second = job(8);
      await mod.queue.publish(flaky.queue, first);
      await mod.queue.publish(stale.queue, second);
      await mod.settle();
      expect(Date.now() - started).toBeLessThan(10_000); // no real waiting: the clock was moved
      expect(seen.map((s) => s.attempt)).toEqual([1, 2]);
      const waited = (seen[1]?.at ?? 0) - (seen[0]?.at ?? 0);
      expect(waited).toBeGreaterThanOrEqual(30_000);
      expect(waited).toBeLessThan(60_000);
      expect(await effectRows(flaky.name)).toEqual([{ jobId: first.job_id, amount: 7 }]);
      // Expired by the shared clock (with Date.now the retry would look seconds old and run again).
      const letters = await pg.sql<{ errorClass: string }[]>`
        select error_class as "errorClass" from core.dead_letters where job_id = ${second.job_id}`;
      expect(letters).toEqual([{ errorClass: "expired" }]);
    } finally {
      await mod.close();
    }
    await expect(
      createModule({
        name: "module-test",
        consumers: [flaky],
        db: pg.url,
        clock: createManualClock(),
        transport: memory({ clock }),
      }),
    ).rejects.toThrow(/clock and the memory transport's clock differ/);
  });

  test('PGlite: db "embedded" (or no db and no DATABASE_URL) starts empty and is migrated in place', async () => {
    const mod = await createModule({
      name: "module-test",
      consumers: [award, notify],
      migrations: moduleMigrations,
      db: "embedded",
      transport: memory(),
      outbox: true,
      logger: silentLogger,
    });
    try {
      expect(mod.database).toBe("pglite");
      const credit = job(3);
      await mod.queue.publish(award.queue, credit);
      await mod.queue.publish(award.queue, credit);
      await mod.settle();
      const rows = await mod.db.select().from(effects);
      expect(rows.map((r) => `${r.consumer} ${r.amount}`).sort()).toEqual([
        "module-test.award 3",
        "module-test.notify 3",
      ]);
    } finally {
      await mod.close();
    }
    // No db and no DATABASE_URL means the embedded one too; with DATABASE_URL, that server.
    expect(chooseDatabase("module-test", undefined, {})).toEqual({ kind: "embedded" });
    expect(chooseDatabase("module-test", undefined, { DATABASE_URL: pg.url })).toEqual({ kind: "url", url: pg.url });
  });
});

describe("transport choice", () => {
  test("fromEnv: SOFTCRUM_QUEUE unset, empty or memory is the in-process adapter, vercel is Vercel Queues, anything else is refused by name", () => {
    expect(fromEnv({ env: {} }).kind).toBe("memory");
    expect(fromEnv({ env: { SOFTCRUM_QUEUE: "" } }).kind).toBe("memory");
    expect(fromEnv({ env: { SOFTCRUM_QUEUE: "memory" }, memory: { concurrency: 2 } })).toEqual(
      memory({ concurrency: 2 }),
    );
    expect(fromEnv({ env: { SOFTCRUM_QUEUE: "vercel" }, vercel: { region: "iad1" } })).toEqual(
      vercel({ region: "iad1" }),
    );
    const refused = (() => {
      try {
        return fromEnv({ env: { SOFTCRUM_QUEUE: "sqs" } });
      } catch (error) {
        return error;
      }
    })();
    expect(refused).toBeInstanceOf(InvalidConfigError);
    expect((refused as Error).message).toBe(
      'SOFTCRUM_QUEUE must be "memory" or "vercel" (unset means "memory"), got "sqs"',
    );
  });

  test("the in-process path never loads the Vercel adapter or its SDK", async () => {
    const dir = mkdtempSync(join(tmpdir(), "softcrum-module-lazy-"));
    try {
      const script = join(dir, "memory-only.mts");
      const index = fileURLToPath(new URL("./index.ts", import.meta.url));
      const hook = `export async function resolve(specifier, context, next) {
        if (/vercel/i.test(specifier)) throw new Error("loaded " + specifier);
        return next(specifier, context);
      }`;
      writeFileSync(
        script,
        `import { register } from "node:module";
        register("data:text/javascript," + encodeURIComponent(${JSON.stringify(hook)}));
        const { createModule, memory } = await import(${JSON.stringify(index)});
        const mod = await createModule({ name: "lazy", consumers: [], db: process.env.MODULE_TEST_DB, transport: memory() });
        await mod.settle();
        await mod.close();
        const control = await import(${JSON.stringify(index.replace(/module[/\\]index\.ts$/, "adapters/vercel/index.ts"))}).then(() => "loaded", () => "refused");
        console.log("memory module ran; vercel adapter " + control);`,
      );
      const result = await runScript(script, [], { env: { SOFTCRUM_QUEUE: "memory", MODULE_TEST_DB: pg.url } });
      expect(result.stderr).toBe("");
      expect(result.stdout.trim()).toBe("memory module ran; vercel adapter refused");
      expect(result.code).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("bad input fails at start with a typed error, before anything is opened", () => {
  // A URL nobody listens on: reaching it would fail differently.
  const nowhere = "postgres://postgres@127.0.0.1:1/none";

  test("duplicate consumer names, an unknown consumer in routes, a bad db, a transport that is not one, the vercel transport on an embedded database", async () => {
    const base = { name: "module-test", db: nowhere, transport: memory(), logger: silentLogger };
    await expect(createModule({ ...base, consumers: [award, award] })).rejects.toBeInstanceOf(DuplicateConsumerError);
    const unknown = await createModule({
      ...base,
      consumers: [award],
      routes: { "module-test.typo": { maxDeliveries: 12 } },
    }).catch((error: unknown) => error);
    expect(unknown).toBeInstanceOf(UnknownConsumerError);
    expect(unknown).toMatchObject({ consumer: "module-test.typo", known: [award.name] });
    expect((unknown as Error).message).toMatch(/routes names consumer "module-test.typo"/);
    await expect(createModule({ ...base, consumers: [award], db: "mysql://u:secret@h/db" })).rejects.toThrow(
      /db must be a postgres:\/\/ or postgresql:\/\/ URL .*got a "mysql" URL \(not shown/,
    );
    await expect(
      createModule({ ...base, consumers: [award], transport: "memory" as unknown as ReturnType<typeof memory> }),
    ).rejects.toThrow(/transport must be memory\(\), vercel\(\) or fromEnv\(\)/);
    const embedded = await createModule({
      ...base,
      consumers: [award],
      db: "embedded",
      transport: vercel({ region: "iad1" }),
    }).catch((error: unknown) => error);
    expect(isSoftcrumError(embedded, "INVALID_CONFIG")).toBe(true);
    expect((embedded as Error).message).toMatch(/needs DATABASE_URL or db: a real Postgres/);
    await expect(createModule({ ...base, consumers: [{ name: "x" } as unknown as Consumer] })).rejects.toThrow(
      /consumers\[0\] is not a consumer/,
    );
  });
});

describe("a database given by URL", () => {
  test("an unmigrated one is refused (NotMigratedError) and nothing is created; migrateModule, idempotent, makes it startable", async () => {
    const url = await freshDatabase();
    const refused = await createModule({
      name: "module-test",
      consumers: [award],
      migrations: moduleMigrations,
      db: url,
      transport: memory(),
    }).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(NotMigratedError);
    expect((refused as NotMigratedError).pending).toContain("0000_module_effects");
    const other = postgres(url, { max: 1, onnotice: () => {} });
    try {
      expect(await other`select nspname from pg_namespace where nspname in ('core', 'module_test', 'drizzle')`).toEqual(
        [],
      );
      // Started together: one run applies everything, the other waits for the lock and finds nothing to do.
      const [a, b] = await Promise.all([
        migrateModule(url, moduleMigrations, { label: "test", lockPollMs: 20 }),
        migrateModule(url, [moduleMigrations, coreMigrations], { label: "test", lockPollMs: 20 }),
      ]);
      const applied = [...(a?.applied ?? []), ...(b?.applied ?? [])];
      expect(applied.filter((t) => t === "test/0000_module_effects")).toHaveLength(1);
      expect(applied.filter((t) => t.startsWith("core/")).length).toBeGreaterThan(10);
      expect(new Set(applied).size).toBe(applied.length);
      const again = await migrateModule(url, moduleMigrations, { label: "test" });
      expect(again).toEqual({ applied: [], core: [], module: [] });
    } finally {
      await other.end({ timeout: 5 });
    }
    const mod = await createModule({
      name: "module-test",
      consumers: [award],
      migrations: moduleMigrations,
      db: url,
      transport: memory(),
      logger: silentLogger,
    });
    try {
      expect(mod.database).toBe("postgres");
      expect(await mod.db.select().from(effects)).toEqual([]);
    } finally {
      await mod.close();
    }
  });

  test("a Drizzle database given as it is: checked, used, and left open", async () => {
    const mod = await createModule({
      name: "module-test",
      consumers: [notify],
      migrations: moduleMigrations,
      db: pg.db,
      transport: memory(),
      logger: silentLogger,
    });
    const note = job(4, "test.notify.v1");
    await mod.queue.publish(notify.queue, note);
    await mod.settle();
    await mod.close();
    expect(await effectRows(notify.name)).toEqual([{ jobId: note.job_id, amount: 4 }]);
  });
});

describe("createModule on Vercel Queues", () => {
  test("a push route per consumer with its trigger's options; unknown names in route() and startWorker() are typed errors", async () => {
    const fake = await startFakeVercelQueues();
    const mod = await createModule({
      name: "module-test",
      consumers: [award, notify],
      migrations: moduleMigrations,
      db: pg.url,
      transport: vercel({ ...fake.clientOptions(), env: {} }),
      outbox: true,
      logger: silentLogger,
      routes: { [award.name]: { trigger: { maxDeliveries: 12, retryAfterSeconds: 30 } } },
    });
    try {
      expect(mod.transport).toBe("vercel");
      expect(Object.keys(mod.routes).sort()).toEqual([award.name, notify.name]);
      expect(() => mod.route("module-test.typo")).toThrow(UnknownConsumerError);
      expect(() => mod.startWorker("module-test.typo")).toThrow(/startWorker\(\) names consumer "module-test.typo"/);
      fake.subscribePush(toVercelTopic(award.queue), mod.route(award.name), { maxDeliveries: 12 });
      fake.subscribePush(toVercelTopic(notify.queue), mod.route(notify.name));
      const credit = job(9);
      await mod.queue.publish(award.queue, credit);
      await mod.queue.publish(award.queue, credit);
      await fake.dispatch();
      // The relay (woken by the credit's commit) publishes what it wrote to the outbox; the notify route runs it.
      await mod.outboxRelay.run();
      await fake.dispatch();
      expect(fake.callbacks.map((c) => c.status)).toEqual([200, 200, 200]);
      expect(await effectRows(award.name)).toEqual([{ jobId: credit.job_id, amount: 9 }]);
      expect((await effectRows(notify.name)).map((r) => r.amount)).toEqual([9]);
    } finally {
      await mod.close();
      await fake.close();
    }
  });
});
