import { migrateCore } from "@softcrum/core/migrate";
import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";
import { migrateNotifications } from "../src/migrations.ts";

export default createPostgresGlobalSetup("notifications", async (url) => {
  await migrateCore(url);
  await migrateNotifications(url);
});
