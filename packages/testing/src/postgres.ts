import { randomBytes } from "node:crypto";
import postgres from "postgres";

/** Where the tests' Postgres came from, and how to stop it if we started it. */
export interface PostgresServer {
  /** A URL for the maintenance database, with the right to CREATE DATABASE. */
  readonly adminUrl: string;
  readonly source: "TEST_DATABASE_URL" | "127.0.0.1:5432" | "testcontainers";
  stop(): Promise<void>;
}

const LOCAL_URL = "postgres://postgres@127.0.0.1:5432/postgres";

export const NO_POSTGRES_MESSAGE =
  "No Postgres for the tests: set TEST_DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/DB (a user that may CREATE DATABASE), " +
  "or run a server on 127.0.0.1:5432 that user postgres can reach, or start Docker so testcontainers can run one.";

/**
 * Finds a real Postgres, in the order SPEC §8 gives: TEST_DATABASE_URL, else a
 * server on 127.0.0.1:5432 as user postgres, else a testcontainers Postgres
 * when Docker is there, else an error saying how to provide one.
 */
export async function findPostgres(): Promise<PostgresServer> {
  const fromEnv = process.env["TEST_DATABASE_URL"];
  if (fromEnv) {
    const problem = await reach(fromEnv);
    if (problem) throw new Error(`TEST_DATABASE_URL is set but unreachable (${problem}). ${NO_POSTGRES_MESSAGE}`);
    return { adminUrl: fromEnv, source: "TEST_DATABASE_URL", stop: async () => {} };
  }
  if (!(await reach(LOCAL_URL))) return { adminUrl: LOCAL_URL, source: "127.0.0.1:5432", stop: async () => {} };
  try {
    const { PostgreSqlContainer } = await import("@testcontainers/postgresql");
    const container = await new PostgreSqlContainer("postgres:16-alpine").start();
    return {
      adminUrl: container.getConnectionUri(),
      source: "testcontainers",
      stop: async () => {
        await container.stop();
      },
    };
  } catch {
    throw new Error(NO_POSTGRES_MESSAGE);
  }
}

/** Undefined when `select 1` works, else why not. */
async function reach(url: string): Promise<string | undefined> {
  const sql = postgres(url, { max: 1, connect_timeout: 3, onnotice: () => {} });
  try {
    await sql`select 1`;
    return undefined;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** The same server, another database. */
export function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

export function uniqueDatabaseName(prefix: string, label: string): string {
  const slug = label
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, "_")
    .slice(-30);
  return `${prefix}_${slug}_${randomBytes(4).toString("hex")}`.slice(0, 63);
}

/** Runs `work` with a one-connection admin client on the maintenance database. */
export async function withAdmin<T>(adminUrl: string, work: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    return await work(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
