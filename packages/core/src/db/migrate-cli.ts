// `pnpm db:migrate`: applies the core migrations to $DATABASE_URL.
import { migrateCore } from "./migrate.ts";

const url = process.env["DATABASE_URL"];
if (!url) {
  console.error(
    "DATABASE_URL is not set; e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres pnpm db:migrate",
  );
  process.exit(2);
}
try {
  await migrateCore(url);
  console.log("core migrations applied");
} catch (error) {
  console.error(`core migrations failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
