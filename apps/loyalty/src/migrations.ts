import { fileURLToPath } from "node:url";
import { type MigrateOptions, type MigrateReport, type MigrationSet, migratePostgres } from "@softcrum/core/migrate";

export const loyaltyMigrationsFolder = fileURLToPath(new URL("../drizzle", import.meta.url));
export const loyaltyMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__loyalty_migrations" };
export const loyaltyMigrations: MigrationSet = { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable };

/** Applies the loyalty module's migrations, under the migration lock. Idempotent. */
export function migrateLoyalty(databaseUrl: string, options: MigrateOptions = {}): Promise<MigrateReport> {
  return migratePostgres(databaseUrl, loyaltyMigrations, options);
}
