import { fileURLToPath } from "node:url";

/**
 * The folder of @softcrum/core's generated SQL migrations (the repository's
 * top-level `drizzle/`), for drizzle-orm's migrator of whichever driver the
 * module uses: `migrate(db, { migrationsFolder: coreMigrationsFolder })`.
 */
export const coreMigrationsFolder = fileURLToPath(new URL("../../../../drizzle", import.meta.url));

/** Drizzle's bookkeeping table for the core migrations (kept apart from each module's own). */
export const coreMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__softcrum_core_migrations" };

/** Applies the core migrations to a Postgres database through postgres.js. Idempotent. */
export async function migrateCore(databaseUrl: string): Promise<void> {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const client = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  try {
    await migrate(drizzle({ client }), { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable });
  } finally {
    await client.end();
  }
}
