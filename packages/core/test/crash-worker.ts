// A worker process for crash.test.ts: delivers one job through the harness on
// a real connection and reports its progress on stdout, so the test can
// SIGKILL it at a chosen point.
//   mode "inside-transaction": the handler writes its effect, says IN_TRANSACTION, then hangs;
//   mode "after-commit": the delivery commits, the worker says COMMITTED, then hangs before any ack.
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { bindConsumer, defineConsumer } from "../src/index.ts";
import { effects } from "./fixtures.ts";

const [url, mode, body, applicationName] = process.argv.slice(2);
if (!url || !body || !applicationName || (mode !== "inside-transaction" && mode !== "after-commit")) {
  console.error("usage: crash-worker.ts DATABASE_URL inside-transaction|after-commit BODY APPLICATION_NAME");
  process.exit(2);
}

const sql = postgres(url, { max: 1, connection: { application_name: applicationName } });
const hang = () => new Promise(() => setInterval(() => {}, 1 << 30));

const consumer = defineConsumer({
  name: "crash.award",
  queue: "crash.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "crash.award", amount: data.points });
    if (mode === "inside-transaction") {
      process.stdout.write("IN_TRANSACTION\n");
      await hang();
    }
  },
});

const result = await bindConsumer(consumer, { db: drizzle({ client: sql }) }).deliver({ body, deliveryCount: 1 });
process.stdout.write(`COMMITTED ${result.outcome}\n`);
await hang();
