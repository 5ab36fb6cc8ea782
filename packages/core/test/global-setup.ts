import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";
import { migrateCore } from "../src/db/migrate.ts";

export default createPostgresGlobalSetup("core", migrateCore);
