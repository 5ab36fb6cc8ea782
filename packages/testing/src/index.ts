export type { PostgresServer } from "./postgres.ts";
export { findPostgres, NO_POSTGRES_MESSAGE, uniqueDatabaseName, withAdmin, withDatabase } from "./postgres.ts";
export type { ScriptResult } from "./run-script.ts";
export { runScript } from "./run-script.ts";
export type { Connection, TestDatabase } from "./test-database.ts";
export { useTestDatabase } from "./test-database.ts";
export type { ThrowawayPostgres, ThrowawayPostgresOptions } from "./throwaway-postgres.ts";
export { startThrowawayPostgres } from "./throwaway-postgres.ts";
