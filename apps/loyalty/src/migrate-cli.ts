// `pnpm db:migrate` (from the root): the loyalty module's tables on $DATABASE_URL.
import { runMigrationsCli } from "@softcrum/core/migrate";
import { migrateLoyalty } from "./migrations.ts";

await runMigrationsCli("loyalty", migrateLoyalty);
