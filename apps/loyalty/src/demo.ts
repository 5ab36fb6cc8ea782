// `pnpm demo`: runs the loyalty module end to end and prints what happened.
// With no DATABASE_URL it uses an embedded Postgres (PGlite); set DATABASE_URL
// to run the same stream against a real server.
import { isSoftcrumError } from "@softcrum/core";
import { runDemo } from "./demo-scenario.ts";

let summary: Awaited<ReturnType<typeof runDemo>>;
try {
  summary = await runDemo();
} catch (error) {
  // A configuration problem (e.g. a database not migrated yet) is one clear line, not a stack trace.
  if (!isSoftcrumError(error, "INVALID_CONFIG")) throw error;
  console.error(error.message);
  process.exit(2);
}
const pad = (text: string | number, width: number) => String(text).padEnd(width);

console.log(
  `Softcrum loyalty demo — database: ${summary.database === "pglite" ? "embedded PGlite (set DATABASE_URL for a real Postgres)" : "Postgres from DATABASE_URL"}`,
);
console.log("");
console.log(
  `published   ${summary.published.jobs} award jobs, ${summary.published.duplicateCopies} duplicate copies, ${summary.published.poison} poison payloads`,
);
console.log(`deliveries  ${summary.deliveries}`);
const o = summary.outcomes;
console.log(
  `outcomes    success ${o.success}, duplicate ${o.duplicate}, retry ${o.retry}, dead_lettered ${o.dead_lettered}, poison ${o.poison}`,
);
for (const [consumer, counts] of Object.entries(summary.outcomesByConsumer)) {
  console.log(
    `  ${pad(consumer, 24)} ${Object.entries(counts)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ")}`,
  );
}
console.log(
  `credits     ${summary.creditsApplied} ledger rows, ${summary.partnerNotifications} partner notifications (through the outbox, after each credit committed)`,
);
console.log(
  `dead letters ${Object.entries(summary.deadLetters)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ")}`,
);
console.log("");
console.log(`${pad("tenant", 8)} ${pad("customer", 10)} ${pad("credited", 9)} expected`);
for (const b of summary.balances) {
  console.log(
    `${pad(b.tenant, 8)} ${pad(b.customer, 10)} ${pad(b.points, 9)} ${b.expected}${b.points === b.expected ? "" : "  <-- MISMATCH"}`,
  );
}
console.log("");
if (summary.ok) {
  console.log(
    "OK: every balance grew by exactly the expected points; no job was applied twice; the partner was told of each credit it accepted exactly once.",
  );
} else {
  console.log(
    "FAILED: balances differ from the expected ones, a job was applied twice, or the partner's notifications do not match the credits.",
  );
  process.exitCode = 1;
}
