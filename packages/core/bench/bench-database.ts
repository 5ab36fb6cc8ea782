/**
 * A throwaway database for one benchmark: migrated, with the ledger table the
 * benchmark handlers write to, and a pool of `max` connections.
 */
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import postgres from "postgres";
import { migrateCore } from "../src/db/migrate.ts";

export async function benchDatabase(label: string, max: number) {
  const server = await findPostgres();
  const database = uniqueDatabaseName("softcrum_bench", label);
  await withAdmin(server.adminUrl, (admin) => admin`create database ${admin(database)}`);
  const url = withDatabase(server.adminUrl, database);
  const sql = postgres(url, { max, onnotice: () => {} });
  await migrateCore(url);
  await sql`create table bench_ledger (id bigserial primary key, job_id uuid not null, amount integer not null)`;
  return {
    server,
    url,
    sql,
    /** Closes the pool, drops the database and stops a server the benchmark started. */
    async drop() {
      await sql.end({ timeout: 5 });
      await withAdmin(server.adminUrl, (admin) => admin`drop database if exists ${admin(database)} with (force)`);
      await server.stop();
    },
  };
}
