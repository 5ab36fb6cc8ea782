/**
 * The database types every part of the core shares: a module of their own, so
 * that the harness, the work-transaction engine and the outbox writer import
 * them without importing each other.
 */
import type { PgDatabase, PgQueryResultHKT, PgTransaction } from "drizzle-orm/pg-core";

// biome-ignore lint/suspicious/noExplicitAny: any Drizzle Postgres database (postgres.js, node-postgres, PGlite) with any schema.
export type AnyPgDatabase = PgDatabase<PgQueryResultHKT, any, any>;
/** The Drizzle transaction a handler does its work in; the fence is already written in it. */
// biome-ignore lint/suspicious/noExplicitAny: the module's own schema types are not known here.
export type WorkTransaction = PgTransaction<PgQueryResultHKT, any, any>;
