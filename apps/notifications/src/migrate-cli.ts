// `pnpm db:migrate` (from the root): the notifications module's tables on $DATABASE_URL.
import { runMigrationsCli } from "@softcrum/core/migrate";
import { migrateNotifications } from "./migrations.ts";

await runMigrationsCli("notifications", migrateNotifications);
