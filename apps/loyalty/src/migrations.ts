import { fileURLToPath } from "node:url";

export const loyaltyMigrationsFolder = fileURLToPath(new URL("../drizzle", import.meta.url));
export const loyaltyMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__loyalty_migrations" };
