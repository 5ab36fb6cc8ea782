// A worker process for the connection-fault tests (#8 item 11): it consumes
// every job in FILE (a JSON array of envelopes) through the harness and the
// in-process adapter, on a postgres.js pool of 4 connections, while the test
// terminates its backends or restarts the server. It reports on stdout:
//   SETTLED <outcome>          after every delivery;
//   DONE <json>                once every job is acknowledged: outcome counts, the
//                              errors of failed deliveries, the notices seen;
//   PONG <n>                   after "PING" on stdin: a query through the same pool worked;
//   STALLED ...                every second once nothing has settled for 5 s: the
//                              deliveries in flight, the reserve() calls waiting;
//   EXITING ...                when the process ends before its work is done;
// and exits 0 after "EXIT" on stdin. A crash (e.g. an uncaught TypeError from
// postgres.js) exits non-zero with the stack on stderr.
import { readFile } from "node:fs/promises";
import { createInterface } from "node:readline";
import { sql as dsql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { type BoundConsumer, bindConsumer, defineConsumer, type Envelope } from "../src/index.ts";
import { effects } from "./fixtures.ts";

const [url, file, applicationName] = process.argv.slice(2);
if (!url || !file || !applicationName) {
  console.error("usage: fault-worker-process.ts DATABASE_URL FILE APPLICATION_NAME");
  process.exit(2);
}

const notices: Record<string, number> = {};
const sql = postgres(url, {
  max: 4,
  connect_timeout: 5,
  // Reconnect within 0.2 s after a failure instead of postgres.js's default
  // (up to 20 s, growing with every failed connection of the pool): the same
  // recovery, inside the test's time budget.
  backoff: () => 0.2,
  connection: { application_name: applicationName },
  onnotice: (notice) => {
    const key = `${notice["code"]} ${notice["message"]}`;
    notices[key] = (notices[key] ?? 0) + 1;
  },
});
// Counts reserve() calls still waiting for a connection, for the STALLED line.
let waitingForConnection = 0;
const reserve = sql.reserve.bind(sql);
sql.reserve = async () => {
  waitingForConnection += 1;
  try {
    return await reserve();
  } finally {
    waitingForConnection -= 1;
  }
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const FAULTS_CONSUMER = "faults.award";
const consumer = defineConsumer({
  name: FAULTS_CONSUMER,
  queue: "faults.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  // Retries come back in a fraction of a second; the budget stays the default 5.
  retry: { maxAttempts: 5, baseDelayMs: 100, maxDelayMs: 800 },
  async handle(data, { tx, envelope }) {
    const write = () =>
      tx.insert(effects).values({ jobId: envelope.job_id, consumer: FAULTS_CONSUMER, amount: data.points });
    // A third of the jobs wait inside the transaction on the server, a third
    // in Node with the transaction idle: that is where the test kills backends.
    switch (data.points % 3) {
      case 0:
        await write();
        await tx.execute(dsql`select pg_sleep(0.1)`);
        break;
      case 1:
        await sleep(100);
        await write();
        break;
      default:
        await write();
    }
  },
});

const harness = bindConsumer(consumer, {
  db: drizzle({ client: sql }),
  logger: { warn: () => {}, error: () => {} },
});
// Deliveries in flight, so a wedge can say which ones never settled.
const inFlight = new Map<object, { job: string; delivery: number; since: number }>();
const bound: BoundConsumer = {
  name: harness.name,
  queue: harness.queue,
  async deliver(delivery) {
    const key = {};
    const job = typeof delivery.body === "string" ? (JSON.parse(delivery.body) as Envelope).job_id : "?";
    inFlight.set(key, { job, delivery: delivery.deliveryCount, since: Date.now() });
    try {
      return await harness.deliver(delivery);
    } finally {
      inFlight.delete(key);
    }
  },
};
// Node exits (with 13) when the event loop empties while the top-level await
// below still waits: a delivery whose promise will never settle (a wedged
// connection). Say which ones. (The exit event sees code 0 then, hence the flag.)
let finished = false;
process.on("exit", () => {
  if (finished) return;
  const now = Date.now();
  const stuck = [...inFlight.values()].map((d) => ({ ...d, since: `${now - d.since} ms ago` }));
  process.stdout.write(`EXITING before the end, deliveries in flight: ${JSON.stringify(stuck)}\n`);
});
const queue = createMemoryQueue({ concurrency: 4, visibilityTimeoutMs: 2_000 });
const outcomes: Record<string, number> = {};
const errors: Record<string, number> = {};
queue.onDelivery((event) => {
  const { outcome } = event.result;
  outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
  const error = "error" in event.result ? event.result.error : undefined;
  if (error !== undefined) {
    // Job ids and pids vary; the kind of failure is what matters.
    const key = `${outcome}: ${String(error)
      .replace(/[0-9a-f]{8}-[0-9a-f-]{27}/g, "<uuid>")
      .replace(/\d+/g, "N")
      .slice(0, 200)}`;
    errors[key] = (errors[key] ?? 0) + 1;
  }
  process.stdout.write(`SETTLED ${outcome}\n`);
});
queue.subscribe(bound);

const envelopes = JSON.parse(await readFile(file, "utf8")) as Envelope[];
for (const envelope of envelopes) await queue.publish(consumer.queue, envelope);
// Keeps the event loop alive while draining: the in-process adapter's drain()
// waits on an unref'd timer for a retried message, so without this the process
// can exit (code 13) just as a retry falls due. Also says which deliveries are
// stuck when nothing has settled for 5 s (a wedged connection).
let lastSettled = Date.now();
queue.onDelivery(() => {
  lastSettled = Date.now();
});
const watchdog = setInterval(() => {
  if (Date.now() - lastSettled < 5_000) return;
  const now = Date.now();
  const stuck = [...inFlight.values()].map((d) => ({ ...d, since: `${now - d.since} ms ago` }));
  process.stdout.write(
    `STALLED for ${now - lastSettled} ms, ${queue.pending()} messages pending, ${waitingForConnection} reserve() calls waiting for a connection, deliveries in flight: ${JSON.stringify(stuck)}\n`,
  );
}, 1_000);
await queue.drain();
clearInterval(watchdog);
process.stdout.write(`DONE ${JSON.stringify({ outcomes, errors, notices })}\n`);

for await (const line of createInterface({ input: process.stdin })) {
  if (line === "PING") {
    const [row] = await sql<{ n: number }[]>`select 1 as n`;
    process.stdout.write(`PONG ${row?.n}\n`);
  } else if (line === "EXIT") {
    break;
  }
}
process.stdin.destroy();
await queue.close();
await sql.end({ timeout: 5 });
finished = true;
