import { migrateCore } from "@softcrum/core/migrate";
import { migrateLoyalty } from "@softcrum/example-loyalty/migrations";
import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";

export default createPostgresGlobalSetup("ops", async (url) => {
  await migrateCore(url);
  await migrateLoyalty(url);
});
