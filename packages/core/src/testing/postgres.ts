/**
 * Test databases on a real Postgres, framework-neutral (no test runner is
 * imported here): find the server, make a template database migrated once,
 * copy it for each test file, and drop the copy afterwards — or keep it, its
 * name printed, when a test of that file failed. The Vitest wiring (a global
 * setup, per-file hooks) is in `vitest.ts`; with node:test or Jest call these
 * from your own before/after hooks.
 */
import { randomBytes } from "node:crypto";
import postgres from "postgres";
import { coreMigrations, type MigrationSet, migratePostgres } from "../db/migrate.ts";

/** The Postgres the tests use, and how to stop it if whoever found it started it. */
export interface PostgresServer {
  /** A URL for the maintenance database, as a user with the right to CREATE DATABASE. */
  readonly adminUrl: string;
  /** Where it came from, for logs: `TEST_DATABASE_URL`, `127.0.0.1:5432`, or a finder's own name. */
  readonly source: string;
  stop(): Promise<void>;
}

/** The server tried when TEST_DATABASE_URL is not set. */
export const LOCAL_TEST_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres";

/**
 * The Postgres for tests: `TEST_DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432`.
 * When no server answers there, throws an Error whose message is one line:
 * where it looked, why it failed, and what to set.
 */
export async function findTestPostgres(env: NodeJS.ProcessEnv = process.env): Promise<PostgresServer> {
  const fromEnv = env["TEST_DATABASE_URL"];
  const url = fromEnv || LOCAL_TEST_DATABASE_URL;
  const problem = await reachPostgres(url);
  if (problem) throw new Error(noPostgresMessage(url, problem, Boolean(fromEnv)));
  return { adminUrl: url, source: fromEnv ? "TEST_DATABASE_URL" : "127.0.0.1:5432", stop: async () => {} };
}

/** The one-line error of `findTestPostgres`. */
export function noPostgresMessage(url: string, problem: string, fromEnv: boolean): string {
  const where = fromEnv ? `TEST_DATABASE_URL (${redactUrl(url)})` : redactUrl(url);
  const fix = fromEnv
    ? "fix TEST_DATABASE_URL or start that server"
    : "start a server there (user postgres), or set TEST_DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/postgres";
  return `No usable Postgres at ${where}: ${oneLine(problem)}. Tests need one: ${fix} (a user that may CREATE DATABASE).`;
}

/** Undefined when `select 1` works at `url`, else why not (one line). */
export async function reachPostgres(url: string): Promise<string | undefined> {
  let sql: postgres.Sql;
  try {
    sql = postgres(url, { max: 1, connect_timeout: 3, onnotice: () => {} });
  } catch (error) {
    return oneLine(error instanceof Error ? error.message : String(error));
  }
  try {
    await sql`select 1`;
    return undefined;
  } catch (error) {
    const e = error as { message?: string; code?: string };
    return oneLine(e.message || e.code || String(error));
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** The same server, another database. */
export function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${encodeURIComponent(database)}`;
  return u.toString();
}

/** `url` with its password replaced by `***`, for messages. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(an unparsable URL)";
  }
}

/** `prefix_label_random`: lower case, at most 63 characters (Postgres's limit), unique per call. */
export function uniqueDatabaseName(prefix: string, label: string): string {
  const slug = label
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, "_")
    .slice(-30);
  return `${prefix}_${slug}_${randomBytes(4).toString("hex")}`.slice(0, 63);
}

/** Runs `work` with a one-connection client on the maintenance database, closed afterwards. */
export async function withAdmin<T>(adminUrl: string, work: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    return await work(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** How a template database is migrated: core's migrations first, then the module's sets, then `migrate`. */
export interface TemplateMigrations {
  /** The module's migration sets, applied in order after core's. @default none */
  readonly migrations?: readonly MigrationSet[];
  /** Anything else to run on the template once migrated (seed rows, extensions). @default none */
  readonly migrate?: (databaseUrl: string) => Promise<unknown>;
  /** Apply `@softcrum/core`'s own migrations first. @default true */
  readonly includeCore?: boolean;
}

/** A migrated template database, copied by `createDatabaseFrom`. */
export interface TemplateDatabase {
  readonly adminUrl: string;
  readonly template: string;
  /** Drops the template (copies made from it are separate databases and stay). */
  drop(): Promise<void>;
}

/**
 * Creates a database named after `label` on the server and migrates it:
 * what every test file then copies. A migration that fails drops it again
 * and throws.
 */
export async function createTemplateDatabase(
  adminUrl: string,
  label: string,
  how: TemplateMigrations = {},
): Promise<TemplateDatabase> {
  const template = uniqueDatabaseName("softcrum_tpl", label);
  const drop = () => dropDatabase(adminUrl, template);
  await withAdmin(adminUrl, (sql) => sql`create database ${sql(template)}`);
  try {
    const url = withDatabase(adminUrl, template);
    if (how.includeCore ?? true) await migratePostgres(url, coreMigrations);
    for (const set of how.migrations ?? []) await migratePostgres(url, set);
    await how.migrate?.(url);
  } catch (error) {
    await drop().catch(() => {});
    throw error;
  }
  return { adminUrl, template, drop };
}

/** A test file's own database. */
export interface CreatedDatabase {
  readonly adminUrl: string;
  readonly name: string;
  readonly url: string;
}

/** Copies `template` into a new database named after `label` (CREATE DATABASE … TEMPLATE: a file copy, fast). */
export async function createDatabaseFrom(adminUrl: string, template: string, label: string): Promise<CreatedDatabase> {
  const name = uniqueDatabaseName("softcrum_t", label);
  await withAdmin(adminUrl, (sql) => sql`create database ${sql(name)} template ${sql(template)}`);
  return { adminUrl, name, url: withDatabase(adminUrl, name) };
}

/** Drops a database, closing whatever sessions are still on it. */
export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  await withAdmin(adminUrl, (sql) => sql`drop database if exists ${sql(name)} with (force)`);
}

/**
 * Whether a test file's database is kept: when any of its tests (or hooks)
 * failed, so the author can look at what was left. Set
 * SOFTCRUM_KEEP_TEST_DATABASES=1 to keep every one.
 */
export function shouldKeepDatabase(failed: boolean, env: NodeJS.ProcessEnv = process.env): boolean {
  return failed || env["SOFTCRUM_KEEP_TEST_DATABASES"] === "1";
}

/** The line printed for a kept database: its name and a psql command for it. */
export function keptDatabaseMessage(database: CreatedDatabase, failed: boolean): string {
  return (
    `[softcrum] ${failed ? "a test failed: " : ""}kept test database ${database.name} for inspection ` +
    `(psql "${redactUrl(database.url)}"; drop it with: drop database ${database.name})`
  );
}

/**
 * The end of a test file's database: dropped, or kept (`shouldKeepDatabase`)
 * with its name printed through `log` (default console.warn). Says which.
 */
export async function finishDatabase(
  database: CreatedDatabase,
  failed: boolean,
  options: { readonly log?: (line: string) => void; readonly env?: NodeJS.ProcessEnv } = {},
): Promise<"kept" | "dropped"> {
  if (shouldKeepDatabase(failed, options.env)) {
    (options.log ?? console.warn)(keptDatabaseMessage(database, failed));
    return "kept";
  }
  await dropDatabase(database.adminUrl, database.name);
  return "dropped";
}

/** A task tree as test runners report it (Vitest's suites and tests): a state per task, children in `tasks`. */
export interface TaskLike {
  readonly result?: { readonly state?: string } | undefined;
  readonly tasks?: readonly TaskLike[];
}

/** Whether any task in the tree (the suite itself, a test, a nested suite) ended in `fail`. */
export function anyTaskFailed(task: TaskLike | undefined): boolean {
  if (!task) return false;
  if (task.result?.state === "fail") return true;
  return (task.tasks ?? []).some(anyTaskFailed);
}

function oneLine(text: string): string {
  return text.replace(/\s+/g, " ").trim();
}
