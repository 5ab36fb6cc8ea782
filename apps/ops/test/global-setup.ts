import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { migrateCore } from "@softcrum/core/migrate";
import { migrateLoyalty } from "@softcrum/example-loyalty/migrations";
import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";

// The tests run the installed bin, compiled JS (#10 item 13): built once here, before any test spawns it.
execFileSync(process.execPath, [fileURLToPath(new URL("../build.mjs", import.meta.url))], { stdio: "inherit" });

export default createPostgresGlobalSetup("ops", async (url) => {
  await migrateCore(url);
  await migrateLoyalty(url);
});
