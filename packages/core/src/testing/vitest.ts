/**
 * The Vitest wiring of the test databases: `moduleGlobalSetup` (a template
 * migrated once per run) and `useModuleDatabase` (a copy per test file, kept
 * when the file failed). Vitest is an optional peer: it is loaded here only
 * if installed, so the rest of `@softcrum/core/testing` works under node:test
 * or Jest without it.
 */
import { drizzle, type PostgresJsDatabase } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import type { MigrationSet } from "../db/migrate.ts";
import {
  anyTaskFailed,
  type CreatedDatabase,
  createDatabaseFrom,
  createTemplateDatabase,
  findTestPostgres,
  finishDatabase,
  type PostgresServer,
  type TaskLike,
} from "./postgres.ts";

/** What the global setup hands to every test file (Vitest's provide/inject). */
export interface ProvidedPostgres {
  readonly adminUrl: string;
  readonly template: string;
}

/** The provide/inject key of `ProvidedPostgres`. */
export const PROVIDED_KEY = "softcrumPostgres";

/** The parts of Vitest used here, typed locally so the types need no vitest either. */
interface VitestApi {
  beforeAll(fn: (context: object, suite: SuiteLike) => unknown, timeout?: number): void;
  afterAll(fn: (context: object, suite: SuiteLike) => unknown, timeout?: number): void;
  afterEach(fn: (context: { task: TaskLike }) => unknown): void;
  inject(key: string): unknown;
}
type SuiteLike = TaskLike & { readonly name?: string; readonly file?: { readonly name?: string } };

// Vitest when installed, by a name a bundler cannot resolve at build time: the published
// build must import the consumer's vitest, never carry a copy of its own (a second
// runner, with which the hooks below would register nothing).
const VITEST = ["vi", "test"].join("");
const vitest = (await import(/* @vite-ignore */ VITEST).catch(() => undefined)) as VitestApi | undefined;

/** What a Vitest global setup receives (only `provide` is used). */
export interface ProvidingProject {
  readonly provide: unknown;
}

export interface ModuleGlobalSetupOptions {
  /** Names the template database (and, in logs, the run). */
  readonly name: string;
  /** The module's migration sets, applied after `@softcrum/core`'s. @default none */
  readonly migrations?: readonly MigrationSet[];
  /** Run on the template after the migrations (seed rows, extensions). @default none */
  readonly migrate?: (databaseUrl: string) => Promise<unknown>;
  /** Apply `@softcrum/core`'s migrations first. @default true */
  readonly includeCore?: boolean;
  /** Where the server comes from. @default findTestPostgres (TEST_DATABASE_URL, else 127.0.0.1:5432) */
  readonly findServer?: () => Promise<PostgresServer>;
}

/**
 * A Vitest `globalSetup` (export it as the default of the file the config's
 * `test.globalSetup` names): finds Postgres, creates a template database and
 * migrates it once per run (core's migrations, then `migrations`); every
 * test file copies it (`useModuleDatabase`). The template is dropped when the
 * run ends.
 *
 * @example export default moduleGlobalSetup({ name: "loyalty", migrations: [loyaltyMigrations] });
 */
export function moduleGlobalSetup(options: ModuleGlobalSetupOptions) {
  return async function setup(project: ProvidingProject): Promise<() => Promise<void>> {
    const server = await (options.findServer ?? findTestPostgres)();
    let created: Awaited<ReturnType<typeof createTemplateDatabase>>;
    try {
      created = await createTemplateDatabase(server.adminUrl, options.name, options);
    } catch (error) {
      await server.stop();
      throw error;
    }
    const provided: ProvidedPostgres = { adminUrl: server.adminUrl, template: created.template };
    // Untyped on purpose: a module augmentation of "vitest" breaks when pnpm
    // installs several peer variants of it in one workspace.
    (project.provide as (key: string, value: unknown) => void)(PROVIDED_KEY, provided);
    return async () => {
      try {
        await created.drop();
      } finally {
        await server.stop();
      }
    };
  };
}

/** One pool on the test database, raw (postgres.js) and through Drizzle. */
export interface Connection {
  readonly sql: postgres.Sql;
  readonly db: PostgresJsDatabase;
}

/** The calling test file's database (readable inside tests and hooks only). */
export interface TestDatabase extends Connection {
  readonly name: string;
  readonly url: string;
  /** Another pool on the same database (closed after the file), e.g. for real parallel transactions. */
  connect(options?: { max?: number }): Connection;
}

/**
 * Gives the calling test file a database of its own, copied from the
 * template `moduleGlobalSetup` migrated, through Vitest hooks registered
 * where it is called. After the file it is dropped when every test passed,
 * and kept, its name printed, when one failed (see `shouldKeepDatabase`).
 *
 * @param label names the database. @default the test file's name
 */
export function useModuleDatabase(label?: string): TestDatabase {
  if (!vitest) {
    throw new Error(
      "useModuleDatabase() needs vitest (install it as a dev dependency); with another runner use " +
        "createTemplateDatabase / createDatabaseFrom / finishDatabase from your own hooks",
    );
  }
  const { beforeAll, afterAll, afterEach, inject } = vitest;
  const provided = () => {
    const value = inject(PROVIDED_KEY) as ProvidedPostgres | undefined;
    if (!value?.template) {
      throw new Error(
        "useModuleDatabase(): no template database: add a globalSetup file whose default export is " +
          "moduleGlobalSetup({ name, migrations }) to this Vitest project's test.globalSetup",
      );
    }
    return value;
  };
  let state: { database: CreatedDatabase; main: Connection } | undefined;
  const pools: postgres.Sql[] = [];
  let failed = false;
  const ready = () => {
    if (!state) throw new Error("useModuleDatabase(): the database exists only inside tests and hooks");
    return state;
  };
  const connect = (url: string, max: number): Connection => {
    const sql = postgres(url, { max, onnotice: () => {} });
    pools.push(sql);
    return { sql, db: drizzle({ client: sql }) };
  };

  // biome-ignore lint/correctness/noEmptyPattern: Vitest passes the suite only to a hook whose 1st parameter is a pattern.
  beforeAll(async ({}, suite) => {
    const { adminUrl, template } = provided();
    const database = await createDatabaseFrom(adminUrl, template, label ?? suite?.file?.name ?? suite?.name ?? "test");
    state = { database, main: connect(database.url, 10) };
  });
  afterEach((context) => {
    if (context.task.result?.state === "fail") failed = true;
  });
  // biome-ignore lint/correctness/noEmptyPattern: Vitest passes the suite only to a hook whose 1st parameter is a pattern.
  afterAll(async ({}, suite) => {
    await Promise.all(pools.splice(0).map((sql) => sql.end({ timeout: 5 })));
    if (!state) return;
    await finishDatabase(state.database, failed || anyTaskFailed(suite));
  });

  return {
    get name() {
      return ready().database.name;
    },
    get url() {
      return ready().database.url;
    },
    get sql() {
      return ready().main.sql;
    },
    get db() {
      return ready().main.db;
    },
    connect: (options) => connect(ready().database.url, options?.max ?? 10),
  };
}
