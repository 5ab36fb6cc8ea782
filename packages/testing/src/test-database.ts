import { drizzle, type PostgresJsDatabase } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, afterEach, beforeAll, inject } from "vitest";
import { PROVIDED_KEY, type ProvidedPostgres } from "./global-setup.ts";
import { uniqueDatabaseName, withAdmin, withDatabase } from "./postgres.ts";

const provided = () => (inject as (key: string) => unknown)(PROVIDED_KEY) as ProvidedPostgres;

export interface Connection {
  readonly sql: postgres.Sql;
  readonly db: PostgresJsDatabase;
}

export interface TestDatabase extends Connection {
  readonly name: string;
  readonly url: string;
  /** Another pool on the same database (closed after the file), e.g. for real parallel transactions. */
  connect(options?: { max?: number }): Connection;
}

/**
 * Gives the calling test file a database of its own, copied from the migrated
 * template. It is dropped after the file when every test passed, and kept
 * (its name printed) when one failed, so you can look at what was left.
 */
export function useTestDatabase(label: string): TestDatabase {
  let state: { name: string; url: string; main: Connection } | undefined;
  const pools: postgres.Sql[] = [];
  let failed = false;
  const ready = () => {
    if (!state) throw new Error("useTestDatabase(): the database exists only inside tests and hooks");
    return state;
  };
  const connect = (url: string, max: number): Connection => {
    const sql = postgres(url, { max, onnotice: () => {} });
    pools.push(sql);
    return { sql, db: drizzle({ client: sql }) };
  };

  beforeAll(async () => {
    const { adminUrl, template } = provided();
    const name = uniqueDatabaseName("softcrum_t", label);
    await withAdmin(adminUrl, (sql) => sql`create database ${sql(name)} template ${sql(template)}`);
    const url = withDatabase(adminUrl, name);
    state = { name, url, main: connect(url, 10) };
  });
  afterEach((context) => {
    if (context.task.result?.state === "fail") failed = true;
  });
  afterAll(async () => {
    await Promise.all(pools.map((sql) => sql.end({ timeout: 5 })));
    if (!state) return;
    if (failed) {
      console.warn(`[test-database] a test failed: kept database ${state.name} for inspection`);
      return;
    }
    const { adminUrl } = provided();
    const { name } = state;
    await withAdmin(adminUrl, (sql) => sql`drop database if exists ${sql(name)} with (force)`);
  });

  return {
    get name() {
      return ready().name;
    },
    get url() {
      return ready().url;
    },
    get sql() {
      return ready().main.sql;
    },
    get db() {
      return ready().main.db;
    },
    connect: (options) => connect(ready().url, options?.max ?? 10),
  };
}
