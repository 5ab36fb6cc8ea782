/**
 * The repository's Postgres finder: `@softcrum/core/testing`'s (TEST_DATABASE_URL,
 * else 127.0.0.1:5432), and when neither answers, a testcontainers Postgres
 * if Docker is there (SPEC §8). The database helpers are core's.
 */
// Relative: this private package does not depend on @softcrum/core; the code lives there, published.
import {
  findTestPostgres,
  type PostgresServer,
  uniqueDatabaseName,
  withAdmin,
  withDatabase,
} from "../../core/src/testing/postgres.ts";

export type { PostgresServer };
export { uniqueDatabaseName, withAdmin, withDatabase };

export const NO_POSTGRES_MESSAGE =
  "No Postgres for the tests: set TEST_DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/DB (a user that may CREATE DATABASE), " +
  "or run a server on 127.0.0.1:5432 that user postgres can reach, or start Docker so testcontainers can run one.";

/**
 * Finds a real Postgres, in the order SPEC §8 gives: TEST_DATABASE_URL, else a
 * server on 127.0.0.1:5432 as user postgres, else a testcontainers Postgres
 * when Docker is there, else an error saying how to provide one.
 */
export async function findPostgres(): Promise<PostgresServer> {
  try {
    return await findTestPostgres();
  } catch (error) {
    // A TEST_DATABASE_URL that does not answer is a mistake to report, not to work around.
    if (process.env["TEST_DATABASE_URL"]) throw error;
  }
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
