// `pnpm db:migrate`: applies the core migrations to $DATABASE_URL.
import { migrateCore, runMigrationsCli } from "./migrate.ts";

await runMigrationsCli("core", migrateCore);
