/**
 * The driver matrix of the engine's contract suite: every driver the
 * work-transaction engine has (postgres.js, node-postgres, PGlite), each on a
 * database whose default isolation level is read committed, repeatable read
 * or serializable. A test file calls `useDriverMatrix()` at its top level and
 * runs its cases with `describe.each(matrix)`.
 */
import { PGlite } from "@electric-sql/pglite";
import { type TestDatabase, useTestDatabase } from "@softcrum/testing";
import { drizzle as drizzleNodePg } from "drizzle-orm/node-postgres";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { drizzle as drizzlePostgresJs } from "drizzle-orm/postgres-js";
import pg from "pg";
import postgres from "postgres";
import { afterAll, afterEach, beforeAll, beforeEach } from "vitest";
import { coreMigrations, migrate, queryRowsSession } from "../src/db/migrate.ts";
import type { AnyPgDatabase } from "../src/db/types.ts";

export type Isolation = "read committed" | "repeatable read" | "serializable";
export const ISOLATIONS: readonly Isolation[] = ["read committed", "repeatable read", "serializable"];

export interface DriverCase {
  readonly driver: "postgres.js" | "postgres.js unpatched" | "node-postgres" | "PGlite";
  /** The database's default isolation level (what a transaction gets unless it says otherwise). */
  readonly isolation: Isolation;
  /** A real server: other sessions, lock waits and backends that can be terminated. PGlite is one in-process session. */
  readonly server: boolean;
  /**
   * A Drizzle database on this driver: a pool of its own of `max`
   * connections (PGlite: its one session), whose sessions start with
   * `settings` (connection parameters; PGlite: SET on its session until the
   * test ends).
   */
  db(max?: number, settings?: Readonly<Record<string, string>>): AnyPgDatabase;
  /** Rows of a query for the test's own reads and writes, on another session where there is one. */
  rows<T = Record<string, unknown>>(text: string, params?: readonly unknown[]): Promise<T[]>;
  /** The database's URL (server drivers). */
  readonly url: string;
  toString(): string;
}

const EFFECTS_TABLE =
  "create table if not exists test_effects (job_id uuid not null, consumer text not null, amount integer not null)";
const TRUNCATE = "truncate test_effects, core.processed_jobs, core.dead_letters cascade";

/**
 * Registers the hooks that make the databases (one server database and one
 * PGlite per isolation level, each with the core migrations and
 * `test_effects`, emptied before each test) and returns the cases.
 */
export function useDriverMatrix(
  label: string,
  options: { readonly drivers?: readonly DriverCase["driver"][]; readonly isolations?: readonly Isolation[] } = {},
): DriverCase[] {
  const drivers = options.drivers ?? ["postgres.js", "postgres.js unpatched", "node-postgres", "PGlite"];
  const isolations = options.isolations ?? ISOLATIONS;
  const cases: DriverCase[] = [];
  // Pools a test made are closed after it (a server has only so many connections); the PGlites after the file.
  const pools: (() => Promise<unknown>)[] = [];
  const closers: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    await Promise.all(pools.splice(0).map((close) => close()));
  });
  afterAll(async () => {
    await Promise.all(closers.splice(0).map((close) => close()));
  });

  for (const isolation of isolations) {
    const server = drivers.some((d) => d !== "PGlite") ? serverDatabase(label, isolation) : undefined;
    let lite: { client: PGlite; db: AnyPgDatabase } | undefined;
    if (drivers.includes("PGlite")) {
      beforeAll(async () => {
        const client = new PGlite();
        await migrate(queryRowsSession(client), coreMigrations, { lock: false });
        await client.exec(EFFECTS_TABLE);
        // One session: its default stands for the database's.
        await client.exec(`set default_transaction_isolation = '${isolation}'`);
        lite = { client, db: drizzlePglite({ client }) as unknown as AnyPgDatabase };
        closers.push(() => client.close());
      }, 60_000);
      beforeEach(async () => {
        await lite?.client.exec(TRUNCATE);
      });
    }
    for (const driver of drivers) {
      const name = `${driver}, database default ${isolation}`;
      if (driver === "PGlite") {
        const ready = () => {
          if (!lite) throw new Error("the PGlite database exists only inside tests and hooks");
          return lite;
        };
        cases.push({
          driver,
          isolation,
          server: false,
          url: "",
          db: (_max, settings) => {
            const { client, db } = ready();
            for (const [name, value] of Object.entries(settings ?? {})) {
              pools.push(() => client.exec(`reset ${name}`));
              void client.exec(`set ${name} = '${value}'`);
            }
            return db;
          },
          rows: async <T>(text: string, params?: readonly unknown[]) =>
            (await ready().client.query(text, params ? [...params] : [])).rows as T[],
          toString: () => name,
        });
        continue;
      }
      const database = server as TestDatabase;
      cases.push({
        driver,
        isolation,
        server: true,
        get url() {
          return database.url;
        },
        db: (max = 4, settings = {}) => {
          if (driver === "postgres.js" || driver === "postgres.js unpatched") {
            const client = postgres(database.url, { max, onnotice: () => {}, connection: settings });
            pools.push(() => client.end({ timeout: 5 }));
            if (driver === "postgres.js unpatched") withoutThePatch(client);
            return drizzlePostgresJs({ client }) as unknown as AnyPgDatabase;
          }
          const options = Object.entries(settings)
            .map(([name, value]) => `-c ${name}=${value}`)
            .join(" ");
          const pool = new pg.Pool({ connectionString: database.url, max, ...(options ? { options } : {}) });
          pool.on("error", () => {}); // an idle client whose backend went away: the pool replaces it
          pools.push(() => pool.end());
          return drizzleNodePg({ client: pool }) as unknown as AnyPgDatabase;
        },
        rows: async <T>(text: string, params?: readonly unknown[]) =>
          [...(await database.sql.unsafe(text, params ? ([...params] as never[]) : []))] as T[],
        toString: () => name,
      });
    }
  }
  return cases;
}

/** A database of the file's own whose default isolation level is `isolation`. */
function serverDatabase(label: string, isolation: Isolation): TestDatabase {
  const database = useTestDatabase(`${label}-${isolation.replace(" ", "-")}`);
  beforeAll(async () => {
    await database.sql.unsafe(EFFECTS_TABLE);
    // Sessions opened from now on get it; the helper's own pool (used for the
    // test's reads) connected before, and keeps read committed.
    await database.sql.unsafe(`alter database "${database.name}" set default_transaction_isolation = '${isolation}'`);
  });
  beforeEach(async () => {
    await database.sql.unsafe(TRUNCATE);
  });
  return database;
}

/**
 * postgres.js as an app that installed it from npm has it: reservations
 * without patches/postgres@3.4.9.patch's `transactionStatus()` and
 * `terminate()` (porsager/postgres #1208), everything else the real client.
 * The harness must then prove each commit by transaction id, inside begin().
 */
function withoutThePatch(client: postgres.Sql): void {
  const reserve = client.reserve.bind(client);
  Object.assign(client, {
    reserve: async () => {
      const reserved = await reserve();
      return Object.assign(reserved, { transactionStatus: undefined, terminate: undefined });
    },
  });
}

/** Waits until some backend of the case's database is blocked on a lock. */
export async function someoneWaitsOnALock(c: DriverCase): Promise<void> {
  for (let i = 0; i < 500; i++) {
    const [row] = await c.rows<{ n: number }>(
      "select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
    );
    if ((row?.n ?? 0) > 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("no session ever waited on a lock");
}
