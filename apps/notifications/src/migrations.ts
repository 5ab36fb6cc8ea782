import { fileURLToPath } from "node:url";
import { type MigrateOptions, type MigrateReport, type MigrationSet, migratePostgres } from "@softcrum/core/migrate";

export const notificationsMigrationsFolder = fileURLToPath(new URL("../drizzle", import.meta.url));
export const notificationsMigrationsTable = {
  migrationsSchema: "drizzle",
  migrationsTable: "__notifications_migrations",
};
export const notificationsMigrations: MigrationSet = {
  migrationsFolder: notificationsMigrationsFolder,
  ...notificationsMigrationsTable,
};

/** Applies the notifications module's migrations, under the migration lock. Idempotent. */
export function migrateNotifications(databaseUrl: string, options: MigrateOptions = {}): Promise<MigrateReport> {
  return migratePostgres(databaseUrl, notificationsMigrations, options);
}
