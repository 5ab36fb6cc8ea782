import { defineConfig } from "drizzle-kit";

// The module's own migrations, kept apart from @softcrum/core's (../../drizzle).
export default defineConfig({
  dialect: "postgresql",
  schema: "./src/schema.ts",
  out: "./drizzle",
  schemaFilter: ["notifications"],
});
