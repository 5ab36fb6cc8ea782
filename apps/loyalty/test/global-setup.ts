import { migrateCore } from "@softcrum/core/migrate";
import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";
import { migrateLoyalty } from "../src/migrations.ts";

export default createPostgresGlobalSetup("loyalty", async (url) => {
  await migrateCore(url);
  await migrateLoyalty(url);
});
