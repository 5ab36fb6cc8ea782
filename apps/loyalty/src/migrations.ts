import { fileURLToPath } from "node:url";
import { migratePostgres } from "@softcrum/core/migrate";

export const loyaltyMigrationsFolder = fileURLToPath(new URL("../drizzle", import.meta.url));
export const loyaltyMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__loyalty_migrations" };

/** Applies the loyalty module's migrations. Idempotent. */
export function migrateLoyalty(databaseUrl: string): Promise<void> {
  return migratePostgres(databaseUrl, { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable });
}
