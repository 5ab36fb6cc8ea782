// A worker process for the fleet alert tests (#8 item 15): binds a consumer
// whose handler fails with a real Postgres 22P02 (the customer's e-mail cast
// to an integer) to BetterStack alerts coalesced through the database, prints
// READY, waits for GO on stdin (so several processes fire at once), delivers
// COUNT jobs on their last attempt, closes the alerts (sending its summaries)
// and prints DONE <outcomes as JSON>.
//   alert-worker.ts DATABASE_URL INGEST_URL COUNT LABEL
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createBetterStackAlerts } from "../src/alerts/betterstack/index.ts";
import { bindConsumer, createEnvelope, defineConsumer } from "../src/index.ts";

const [url, endpoint, countArg, label] = process.argv.slice(2);
if (!url || !endpoint || !countArg || !label) {
  console.error("usage: alert-worker.ts DATABASE_URL INGEST_URL COUNT LABEL");
  process.exit(2);
}
const quiet = { warn() {}, error() {} };
const client = postgres(url, { max: 3, onnotice: () => {} });
const db = drizzle({ client });
const alerts = createBetterStackAlerts({
  sourceToken: "fleet",
  endpoint,
  db,
  coalesceWindowMs: 600_000,
  sdkOptions: { batchInterval: 20, retryCount: 0 },
  logger: quiet,
});
const consumer = defineConsumer({
  name: "fleet.import",
  queue: "fleet.q",
  kind: "customer.import.v1",
  schema: z.object({ customerId: z.string() }),
  async handle(data, { tx }) {
    await tx.execute(sql`select ${data.customerId}::int`);
  },
});
const bound = bindConsumer(consumer, { db, alerts, logger: quiet });
const bodies = Array.from({ length: Number(countArg) }, (_, i) =>
  JSON.stringify(
    createEnvelope({ tenantId: "acme", kind: "customer.import.v1", data: { customerId: `${label}-${i}@example.com` } }),
  ),
);

await client`select 1`;
process.stdout.write("READY\n");
await new Promise<void>((resolve) => process.stdin.once("data", () => resolve()));
process.stdin.destroy();
const results = await Promise.all(bodies.map((body) => bound.deliver({ body, deliveryCount: 5 })));
await alerts.close();
await client.end();
const outcomes: Record<string, number> = {};
for (const r of results) outcomes[r.outcome] = (outcomes[r.outcome] ?? 0) + 1;
process.stdout.write(`DONE ${JSON.stringify(outcomes)}\n`, () => process.exit(0));
