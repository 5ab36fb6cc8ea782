// `pnpm demo`: runs the loyalty module end to end and prints what happened.
// With no DATABASE_URL it uses an embedded Postgres (PGlite); set DATABASE_URL
// to run the same stream against a real server (migrated: `pnpm db:migrate`).
// The lines are describeDemo's (demo-scenario.ts), asserted by demo.test.ts.
import { isSoftcrumError } from "@softcrum/core";
import { describeDemo, runDemo } from "./demo-scenario.ts";

let summary: Awaited<ReturnType<typeof runDemo>>;
try {
  summary = await runDemo();
} catch (error) {
  // A configuration problem (e.g. a database not migrated yet) is one clear line, not a stack trace.
  if (!isSoftcrumError(error, "INVALID_CONFIG")) throw error;
  console.error(error.message);
  process.exit(2);
}
for (const line of describeDemo(summary)) console.log(line);
if (!summary.ok) process.exitCode = 1;
