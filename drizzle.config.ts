import { defineConfig } from "drizzle-kit";

// Migrations of @softcrum/core's own tables (schema `core`). Modules keep
// theirs beside their code (see apps/loyalty/drizzle.config.ts).
export default defineConfig({
  dialect: "postgresql",
  schema: "./packages/core/src/db/schema.ts",
  out: "./packages/core/drizzle",
  schemaFilter: ["core"],
});
