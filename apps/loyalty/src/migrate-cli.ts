// `pnpm db:migrate` (from the root): the core's tables, then the loyalty module's, on $DATABASE_URL,
// under the migration lock. A deploy step: services only check (`createModule` refuses a database behind them).
import { runModuleMigrationsCli } from "@softcrum/core/module";
import { loyaltyMigrations } from "./migrations.ts";

await runModuleMigrationsCli("loyalty", loyaltyMigrations);
