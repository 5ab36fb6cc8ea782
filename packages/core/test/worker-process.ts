// A worker process for the multi-process tests: delivers jobs through the
// harness on its own connections and reports on stdout, so a test can run
// several at once or SIGKILL one at a chosen point.
//   inside-transaction BODY: the handler writes its effect, prints IN_TRANSACTION, then hangs;
//   after-commit BODY:       the delivery commits, prints COMMITTED <outcome>, then hangs before any ack;
//   deliver-all FILE:        delivers every body in FILE (a JSON array), 4 at a time, prints DONE <outcome counts as JSON>.
import { readFile } from "node:fs/promises";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { bindConsumer } from "../src/index.ts";
import { effectConsumer } from "./fixtures.ts";

const [url, mode, input, applicationName] = process.argv.slice(2);
const modes = ["inside-transaction", "after-commit", "deliver-all"];
if (!url || !mode || !modes.includes(mode) || !input || !applicationName) {
  console.error(`usage: worker-process.ts DATABASE_URL ${modes.join("|")} BODY|FILE APPLICATION_NAME`);
  process.exit(2);
}

const sql = postgres(url, { max: 4, connection: { application_name: applicationName }, onnotice: () => {} });
const hang = () => new Promise(() => setInterval(() => {}, 1 << 30));
const consumer = effectConsumer("worker.award", async () => {
  if (mode === "inside-transaction") {
    process.stdout.write("IN_TRANSACTION\n");
    await hang();
  }
});
const bound = bindConsumer(consumer, { db: drizzle({ client: sql }) });

if (mode === "deliver-all") {
  const bodies = JSON.parse(await readFile(input, "utf8")) as string[];
  const outcomes: Record<string, number> = {};
  let next = 0;
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      while (next < bodies.length) {
        const result = await bound.deliver({ body: bodies[next++], deliveryCount: 1 });
        outcomes[result.outcome] = (outcomes[result.outcome] ?? 0) + 1;
      }
    }),
  );
  process.stdout.write(`DONE ${JSON.stringify(outcomes)}\n`);
  await sql.end();
} else {
  const result = await bound.deliver({ body: input, deliveryCount: 1 });
  process.stdout.write(`COMMITTED ${result.outcome}\n`);
  await hang();
}
