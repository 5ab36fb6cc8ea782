// `pnpm db:migrate` (from the root): the loyalty module's tables on $DATABASE_URL.
import { migrateLoyalty } from "./migrations.ts";

const url = process.env["DATABASE_URL"];
if (!url) {
  console.error(
    "DATABASE_URL is not set; e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres pnpm db:migrate",
  );
  process.exit(2);
}
try {
  await migrateLoyalty(url);
  console.log("loyalty migrations applied");
} catch (error) {
  console.error(`loyalty migrations failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
}
