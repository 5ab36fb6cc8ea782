import { migrateCore } from "@softcrum/core/migrate";
import { createPostgresGlobalSetup } from "@softcrum/testing/global-setup";
import { drizzle } from "drizzle-orm/postgres-js";
import { migrate } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
import { loyaltyMigrationsFolder, loyaltyMigrationsTable } from "../src/migrations.ts";

export default createPostgresGlobalSetup("loyalty", async (url) => {
  await migrateCore(url);
  const client = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await migrate(drizzle({ client }), { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable });
  } finally {
    await client.end();
  }
});
