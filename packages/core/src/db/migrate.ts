/**
 * Our own runner for drizzle-kit's migration folders (ADR 0008). It reads the
 * same `meta/_journal.json` and SQL files as drizzle-orm's migrator and keeps
 * the same bookkeeping table (a row per applied migration: the file's sha256
 * and the journal's `when`), so a database migrated by drizzle's migrator
 * carries on with this one. What it adds:
 * - a session advisory lock around the whole run: concurrent runs (a deploy
 *   step started twice, four processes at once) wait, then find nothing to do;
 * - one transaction per migration, and none for a file that starts with
 *   `-- softcrum-migrate: no-transaction`, so such a file can
 *   `CREATE INDEX CONCURRENTLY` / `DROP INDEX CONCURRENTLY` (which refuse to
 *   run in a transaction) without blocking live traffic.
 * Migrations are a deploy step (`pnpm db:migrate`); services only check that
 * the database is migrated (`assertMigrated`).
 */
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { InvalidConfigError } from "../errors.ts";

/**
 * The folder of @softcrum/core's generated SQL migrations (`drizzle/` at the
 * package's root, shipped in the package):
 * `migratePostgres(url, { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable })`.
 */
export const coreMigrationsFolder = packageMigrationsFolder(fileURLToPath(import.meta.url));

/**
 * The package's `drizzle/`, found from this module's own location: the
 * sources (src/db/) and the built files (dist/, or a chunk of an app's
 * bundler) sit at different depths, so it walks up to the folder holding both
 * the package's package.json and drizzle/meta/_journal.json.
 */
function packageMigrationsFolder(from: string): string {
  let dir = dirname(from);
  for (let depth = 0; depth < 6; depth++) {
    if (existsSync(join(dir, "package.json")) && existsSync(join(dir, "drizzle", "meta", "_journal.json"))) {
      return join(dir, "drizzle");
    }
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  // Reported when a migration runs (readMigrationFolder names the folder), not at import.
  return join(dirname(from), "drizzle");
}

/** The bookkeeping table for the core migrations (kept apart from each module's own). */
export const coreMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__softcrum_core_migrations" };

/** The core's migration set, for `migrate`/`assertMigrated`. */
export const coreMigrations: MigrationSet = { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable };

export interface MigrationSet {
  readonly migrationsFolder: string;
  readonly migrationsSchema: string;
  readonly migrationsTable: string;
}

/** First line of a migration that must run outside a transaction (CREATE/DROP INDEX CONCURRENTLY). */
export const NO_TRANSACTION_MARKER = "-- softcrum-migrate: no-transaction";

/**
 * The session advisory lock every migration run holds (one key for every
 * migration set of a database, so core and module migrations never interleave).
 */
export const MIGRATION_LOCK_KEY = 7_318_114_622_095_046_001n;

export interface MigrationFile {
  /** The journal's tag, e.g. `0002_fence_expiry_index`. */
  readonly tag: string;
  /** The journal's `when`: what the bookkeeping table records as `created_at`. */
  readonly createdAt: number;
  /** sha256 of the file, as drizzle records it. */
  readonly hash: string;
  readonly statements: readonly string[];
  readonly transactional: boolean;
}

/** A migration folder as drizzle-kit wrote it, in journal order. */
export function readMigrationFolder(folder: string): MigrationFile[] {
  if (!existsSync(join(folder, "meta", "_journal.json"))) {
    throw new InvalidConfigError(
      `no migrations at ${folder}: meta/_journal.json is missing (a MigrationSet's migrationsFolder is the folder drizzle-kit generates into)`,
    );
  }
  const journal = JSON.parse(readFileSync(`${folder}/meta/_journal.json`, "utf8")) as {
    entries: { tag: string; when: number }[];
  };
  return journal.entries.map((entry) => {
    const text = readFileSync(`${folder}/${entry.tag}.sql`, "utf8");
    return {
      tag: entry.tag,
      createdAt: entry.when,
      hash: createHash("sha256").update(text).digest("hex"),
      statements: text.split("--> statement-breakpoint").filter((s) => s.trim() !== ""),
      transactional: !text.trimStart().startsWith(NO_TRANSACTION_MARKER),
    };
  });
}

/**
 * One database session (the same connection for every statement: the advisory
 * lock belongs to it). `run` sends one statement without parameters.
 */
export interface MigrationSession {
  run(statement: string): Promise<Record<string, unknown>[]>;
}

export interface MigrateOptions {
  /** Take the advisory lock (off only for a single-process embedded database). @default true */
  readonly lock?: boolean;
  /** How often a run that waits for the lock tries again. @default 250 */
  readonly lockPollMs?: number;
  /**
   * How long one statement may wait for a table lock (`lock_timeout`). A DDL
   * statement that waits for a lock queues every later statement on that
   * table behind it — live work transactions too — so it gives up after
   * this, the file is rolled back, and it is tried again after a backoff
   * (the zero-downtime migration pattern). @default 500
   */
  readonly lockTimeoutMs?: number;
  /** How many times a file whose lock wait timed out is tried again before the run fails. @default 30 */
  readonly lockRetries?: number;
  /** Backoff between those tries: from this, doubling, jittered, up to 10 s. @default 200 */
  readonly lockRetryBaseMs?: number;
}

/** SQLSTATE 55P03, lock_not_available: what `lock_timeout` raises. */
const LOCK_NOT_AVAILABLE = "55P03";
const LOCK_RETRY_CAP_MS = 10_000;

export interface MigrateReport {
  /** Tags this run applied (empty when another run had already applied everything). */
  readonly applied: string[];
}

const ident = (name: string) => `"${name.replaceAll('"', '""')}"`;
const tableOf = (set: MigrationSet) => `${ident(set.migrationsSchema)}.${ident(set.migrationsTable)}`;

/**
 * Applies a migration set's pending migrations on `session`, under the
 * migration lock. Idempotent; safe to run from several processes at once.
 */
export async function migrate(
  session: MigrationSession,
  set: MigrationSet,
  options: MigrateOptions = {},
): Promise<MigrateReport> {
  const files = readMigrationFolder(set.migrationsFolder);
  const lock = options.lock ?? true;
  // Waiting with try-lock between short statements, never inside one: a
  // session blocked in pg_advisory_lock() holds a snapshot, and the lock
  // holder's CREATE INDEX CONCURRENTLY waits for every older snapshot to
  // end — a deadlock (ADR 0008).
  if (lock) await acquire(session, options.lockPollMs ?? 250);
  try {
    await session.run(`CREATE SCHEMA IF NOT EXISTS ${ident(set.migrationsSchema)}`);
    await session.run(
      `CREATE TABLE IF NOT EXISTS ${tableOf(set)} (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)`,
    );
    const last = await lastApplied(session, set);
    const applied: string[] = [];
    const lockTimeoutMs = positiveMs(options.lockTimeoutMs ?? 500, "lockTimeoutMs");
    const retries = Math.max(0, Math.trunc(options.lockRetries ?? 30));
    const baseMs = positiveMs(options.lockRetryBaseMs ?? 200, "lockRetryBaseMs");
    for (const file of files) {
      if (last !== null && file.createdAt <= last) continue;
      for (let attempt = 0; ; attempt += 1) {
        try {
          await applyFile(session, set, file, lockTimeoutMs);
          break;
        } catch (error) {
          if (!(isLockTimeout(error) && attempt < retries)) {
            throw migrationError(
              file,
              error,
              isLockTimeout(error)
                ? ` (a table lock was not free within ${lockTimeoutMs} ms in ${attempt + 1} tries: long transactions hold it; the run can be repeated once they end)`
                : "",
            );
          }
          const backoff = Math.min(LOCK_RETRY_CAP_MS, baseMs * 2 ** attempt);
          await new Promise((resolve) => setTimeout(resolve, backoff / 2 + Math.random() * (backoff / 2)));
        }
      }
      applied.push(file.tag);
    }
    return { applied };
  } finally {
    if (lock) await session.run(`SELECT pg_advisory_unlock(${MIGRATION_LOCK_KEY})`).catch(() => {});
  }
}

/**
 * One file, with every lock wait bounded by `lock_timeout`: a transactional
 * file in one transaction (SET LOCAL), another statement by statement with
 * the session's setting, reset after it. Throws the statement's error as it is.
 */
async function applyFile(
  session: MigrationSession,
  set: MigrationSet,
  file: MigrationFile,
  lockTimeoutMs: number,
): Promise<void> {
  const record = `INSERT INTO ${tableOf(set)} ("hash", "created_at") VALUES ('${file.hash}', ${file.createdAt})`;
  if (file.transactional) {
    await session.run("BEGIN");
    try {
      await session.run(`SET LOCAL lock_timeout = '${lockTimeoutMs}ms'`);
      for (const statement of file.statements) await session.run(statement);
      await session.run(record);
      await session.run("COMMIT");
    } catch (error) {
      await session.run("ROLLBACK").catch(() => {});
      throw error;
    }
    return;
  }
  await session.run(`SET lock_timeout = '${lockTimeoutMs}ms'`);
  try {
    for (const statement of file.statements) {
      await dropInvalidIndexBefore(session, statement);
      await session.run(statement);
    }
    await session.run(record);
  } finally {
    await session.run("RESET lock_timeout").catch(() => {});
  }
}

function isLockTimeout(error: unknown): boolean {
  let cause: unknown = error;
  for (let depth = 0; depth < 4 && cause; depth += 1) {
    if ((cause as { code?: unknown }).code === LOCK_NOT_AVAILABLE) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

function positiveMs(value: number, name: string): number {
  if (!(Number.isSafeInteger(value) && value > 0)) {
    throw new InvalidConfigError(`migrate: ${name} must be a positive whole number of milliseconds, got ${value}`);
  }
  return value;
}

async function acquire(session: MigrationSession, pollMs: number): Promise<void> {
  for (;;) {
    const [row] = await session.run(`SELECT pg_try_advisory_lock(${MIGRATION_LOCK_KEY}) AS "locked"`);
    if (row?.["locked"] === true) return;
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}

async function lastApplied(session: MigrationSession, set: MigrationSet): Promise<number | null> {
  const [row] = await session.run(`SELECT max(created_at)::text AS "last" FROM ${tableOf(set)}`);
  const last = row?.["last"];
  return typeof last === "string" ? Number(last) : null;
}

/**
 * A CREATE INDEX CONCURRENTLY that failed (or was interrupted) leaves an
 * INVALID index behind, which `IF NOT EXISTS` would then keep: drop it first,
 * so a rerun builds it again.
 */
async function dropInvalidIndexBefore(session: MigrationSession, statement: string): Promise<void> {
  const match =
    /CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+("[^"]+"|\w+)\s+ON\s+("[^"]+"|\w+)\./i.exec(
      statement.replace(/^\s*--.*$/gm, ""),
    );
  if (!match?.[1] || !match[2]) return;
  const unquote = (name: string) => name.replace(/^"(.*)"$/, "$1");
  const index = unquote(match[1]);
  const schema = unquote(match[2]);
  const rows = await session.run(
    `SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relname = '${index.replaceAll("'", "''")}' AND n.nspname = '${schema.replaceAll("'", "''")}' AND NOT i.indisvalid`,
  );
  if (rows.length > 0) await session.run(`DROP INDEX CONCURRENTLY IF EXISTS ${ident(schema)}.${ident(index)}`);
}

function migrationError(file: MigrationFile, error: unknown, hint = ""): Error {
  const message = error instanceof Error ? error.message : String(error);
  return new Error(`migration ${file.tag} failed: ${message}${hint}`, { cause: error });
}

/** Tags of a set's migrations that the database has not applied yet (none when its bookkeeping is current). */
export async function pendingMigrations(session: MigrationSession, set: MigrationSet): Promise<string[]> {
  const files = readMigrationFolder(set.migrationsFolder);
  const [exists] = await session.run(`SELECT to_regclass('${tableOf(set).replaceAll("'", "''")}') IS NOT NULL AS "ok"`);
  const last = exists?.["ok"] === true ? await lastApplied(session, set) : null;
  return files.filter((f) => last === null || f.createdAt > last).map((f) => f.tag);
}

/** Thrown at start when the database is behind the code's migrations (an `INVALID_CONFIG` SoftcrumError). */
export class NotMigratedError extends InvalidConfigError {
  readonly pending: readonly string[];
  constructor(pending: readonly string[]) {
    super(
      `the database is not migrated (${pending.length} pending: ${pending.join(", ")}): ` +
        "run `DATABASE_URL=… pnpm db:migrate` as a deploy step before starting services",
    );
    this.pending = pending;
  }
}

/** Refuses to go on (NotMigratedError) when any of `sets` has a pending migration. Services call this at start. */
export async function assertMigrated(session: MigrationSession, sets: readonly MigrationSet[]): Promise<void> {
  const pending = (await Promise.all(sets.map((set) => pendingMigrations(session, set)))).flat();
  if (pending.length > 0) throw new NotMigratedError(pending);
}

/**
 * A postgres.js client as a migration session. For `migrate`, a client of `max: 1`, so every
 * statement is on one connection (the lock's); `assertMigrated` may use any pool.
 */
export function postgresJsSession(client: {
  unsafe(query: string): PromiseLike<readonly unknown[]>;
}): MigrationSession {
  return { run: async (statement) => [...(await client.unsafe(statement))] as Record<string, unknown>[] };
}

/** A PGlite or node-postgres client (`query` resolves to `{ rows }`) as a migration session. */
export function queryRowsSession(client: { query(query: string): Promise<{ rows: unknown[] }> }): MigrationSession {
  return { run: async (statement) => (await client.query(statement)).rows as Record<string, unknown>[] };
}

/** Applies one folder of migrations to a Postgres database through postgres.js, under the migration lock. Idempotent. */
export async function migratePostgres(
  databaseUrl: string,
  set: MigrationSet,
  options: MigrateOptions = {},
): Promise<MigrateReport> {
  const { default: postgres } = await import("postgres");
  const client = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  try {
    return await migrate(postgresJsSession(client), set, options);
  } finally {
    await client.end();
  }
}

/** Applies the core migrations. */
export function migrateCore(databaseUrl: string, options: MigrateOptions = {}): Promise<MigrateReport> {
  return migratePostgres(databaseUrl, coreMigrations, options);
}

/** The body of a `pnpm db:migrate` script: migrates $DATABASE_URL, says what happened, sets the exit code. */
export async function runMigrationsCli(
  label: string,
  migrateUrl: (databaseUrl: string) => Promise<MigrateReport>,
): Promise<void> {
  const url = process.env["DATABASE_URL"];
  if (!url) {
    console.error(
      "DATABASE_URL is not set; e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres pnpm db:migrate",
    );
    process.exitCode = 2;
    return;
  }
  try {
    const { applied } = await migrateUrl(url);
    console.log(
      applied.length > 0
        ? `${label} migrations applied: ${applied.join(", ")}`
        : `${label} migrations: nothing to apply (already up to date)`,
    );
  } catch (error) {
    console.error(`${label} migrations failed: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  }
}
