import { fileURLToPath } from "node:url";

export const loyaltyMigrationsFolder = fileURLToPath(new URL("../drizzle", import.meta.url));
export const loyaltyMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__loyalty_migrations" };

/** Applies the loyalty module's migrations to a Postgres database through postgres.js. Idempotent. */
export async function migrateLoyalty(databaseUrl: string): Promise<void> {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const client = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  try {
    await migrate(drizzle({ client }), { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable });
  } finally {
    await client.end();
  }
}
