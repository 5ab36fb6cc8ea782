/**
 * A module's database, from one option:
 * - a Postgres URL: opened with postgres.js (imported only then). It must be
 *   migrated already (`migrateModule`, a deploy step): a service never
 *   migrates at start, it refuses to (NotMigratedError) on a database behind
 *   its code;
 * - a Drizzle database the caller opened (and closes): checked the same way;
 * - "embedded", or nothing without DATABASE_URL: an embedded Postgres
 *   (PGlite, imported only then). It starts empty, so it is migrated here.
 */
import { sql } from "drizzle-orm";
import { type DrizzleInternals, sessionKind } from "../db/driver.ts";
import type { MigrationSet } from "../db/migrate.ts";
import { assertMigrated, type MigrationSession, migrate, postgresJsSession, queryRowsSession } from "../db/migrate.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { InvalidConfigError } from "../errors.ts";

/** What `createModule({ db })` accepts. */
export type ModuleDatabaseOption = string | AnyPgDatabase | undefined;

/** Which database a module runs on: `postgres` (a server), `pglite` (embedded, one process). */
export type DatabaseKind = "postgres" | "pglite";

export type DatabaseChoice =
  | { readonly kind: "url"; readonly url: string }
  | { readonly kind: "embedded" }
  | { readonly kind: "provided"; readonly db: AnyPgDatabase; readonly database: DatabaseKind };

export interface OpenedDatabase {
  readonly db: AnyPgDatabase;
  readonly database: DatabaseKind;
  /** Closes the database if the module opened it; a provided one is left to its owner. */
  close(): Promise<void>;
}

/** Postgres connections of a pool a module opens from a URL. */
export const DEFAULT_POOL_SIZE = 10;

/** What `db` means, before anything is opened. */
export function chooseDatabase(
  module: string,
  db: unknown,
  env: Readonly<Record<string, string | undefined>>,
): DatabaseChoice {
  if (db === undefined) {
    const url = env["DATABASE_URL"];
    return url ? { kind: "url", url: checkUrl(module, url, "DATABASE_URL") } : { kind: "embedded" };
  }
  if (typeof db === "string") {
    if (db === "" || db === "embedded") return { kind: "embedded" };
    return { kind: "url", url: checkUrl(module, db, "db") };
  }
  const candidate = db as Partial<AnyPgDatabase> | null;
  if (typeof candidate?.transaction === "function" && typeof candidate.execute === "function") {
    const provided = db as AnyPgDatabase;
    const embedded = sessionKind(provided as unknown as DrizzleInternals) === "PgliteSession";
    return { kind: "provided", db: provided, database: embedded ? "pglite" : "postgres" };
  }
  throw new InvalidConfigError(
    `module ${JSON.stringify(module)}: db must be a Postgres URL, a Drizzle Postgres database, or "embedded", got ${
      db === null ? "null" : typeof db
    }`,
  );
}

/** Whether a choice is a database one process owns (it must not back a transport that delivers across processes). */
export function isEmbedded(choice: DatabaseChoice): boolean {
  return choice.kind === "embedded" || (choice.kind === "provided" && choice.database === "pglite");
}

/**
 * Opens (or takes) the database and checks it holds every migration of
 * `sets`; migrates an embedded one. Closes what it opened if that fails.
 */
export async function openDatabase(
  choice: DatabaseChoice,
  sets: readonly MigrationSet[],
  options: { readonly poolSize: number; readonly checkMigrations: boolean },
): Promise<OpenedDatabase> {
  if (choice.kind === "embedded") return openPglite(sets);
  if (choice.kind === "provided") {
    if (options.checkMigrations) await assertMigrated(drizzleSession(choice.db), sets);
    return { db: choice.db, database: choice.database, close: async () => {} };
  }
  return openPostgres(choice.url, sets, options);
}

async function openPostgres(
  url: string,
  sets: readonly MigrationSet[],
  options: { readonly poolSize: number; readonly checkMigrations: boolean },
): Promise<OpenedDatabase> {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const client = postgres(url, { max: options.poolSize, onnotice: () => {} });
  // A few catalog reads on the pool: every start (a Vercel cold start too) checks, none migrates.
  try {
    if (options.checkMigrations) await assertMigrated(postgresJsSession(client), sets);
  } catch (error) {
    await client.end({ timeout: 5 });
    throw error;
  }
  const db = drizzle({ client }) as unknown as AnyPgDatabase;
  return { db, database: "postgres", close: () => client.end({ timeout: 5 }) };
}

async function openPglite(sets: readonly MigrationSet[]): Promise<OpenedDatabase> {
  const { PGlite } = await import("@electric-sql/pglite");
  const { drizzle } = await import("drizzle-orm/pglite");
  const client = new PGlite();
  try {
    // One process owns an embedded database: no lock to take.
    const session = queryRowsSession(client);
    for (const set of sets) await migrate(session, set, { lock: false });
  } catch (error) {
    await client.close();
    throw error;
  }
  const db = drizzle({ client }) as unknown as AnyPgDatabase;
  return { db, database: "pglite", close: () => client.close() };
}

/** A Drizzle database as a migration session, for `assertMigrated` (catalog reads only). */
function drizzleSession(db: AnyPgDatabase): MigrationSession {
  return {
    run: async (statement) => {
      const result: unknown = await db.execute(sql.raw(statement));
      return (Array.isArray(result) ? result : ((result as { rows?: unknown[] }).rows ?? [])) as Record<
        string,
        unknown
      >[];
    },
  };
}

function checkUrl(module: string, url: string, source: string): string {
  if (!/^postgres(ql)?:\/\//i.test(url)) {
    throw new InvalidConfigError(
      `module ${JSON.stringify(module)}: ${source} must be a postgres:// or postgresql:// URL (or "embedded"), got ${/^[a-z][a-z0-9+.-]*:/i.test(url) ? `a ${JSON.stringify(url.split(":")[0])} URL` : "something else"} (not shown: it may hold a password)`,
    );
  }
  return url;
}
