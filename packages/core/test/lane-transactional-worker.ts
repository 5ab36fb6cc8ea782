// A worker process for the lane test (#20 item 2): it publishes COUNT jobs on
// notif.email.transactional through `countTransactional` and an Upstash lane
// backlog (the real `@upstash/redis` client, against the test's REST shim),
// prints `PUBLISHED` once every one of them is counted, then runs them through
// its own in-process queue and the harness on real Postgres — each handler
// records its run in `lane_runs` with the database's clock — and prints
// `DONE` when the queue is drained.
import { Redis } from "@upstash/redis";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../src/consumer.ts";
import { createEnvelope } from "../src/envelope.ts";
import { laneQueue } from "../src/lanes/names.ts";
import { countTransactional } from "../src/lanes/publish.ts";
import { upstashLaneBacklog } from "../src/lanes/upstash.ts";

const [dbUrl, url, token, prefix, count] = process.argv.slice(2);
if (!dbUrl || !url || !token || !prefix || !count) {
  console.error("usage: lane-transactional-worker.ts DB_URL UPSTASH_URL TOKEN PREFIX COUNT");
  process.exit(2);
}
const client = postgres(dbUrl, { max: 4, onnotice: () => {} });
const db = drizzle({ client });
const backlog = upstashLaneBacklog({ redis: new Redis({ url, token, retry: false }), prefix });
const queue = createMemoryQueue({ concurrency: 2 });
const TRANSACTIONAL = laneQueue("email", "transactional");
const consumer = defineConsumer({
  name: "lanes.transactional-worker",
  queue: TRANSACTIONAL,
  kind: "email.send.v1",
  schema: z.object({ n: z.number().int() }),
  handle: async (_data, { tx }) => {
    await new Promise((resolve) => setTimeout(resolve, 20));
    await tx.execute(sql`insert into lane_runs (lane) values ('transactional')`);
  },
});
const publisher = countTransactional(queue, backlog);
for (let n = 0; n < Number(count); n++) {
  await publisher.publish(TRANSACTIONAL, createEnvelope({ tenantId: "t", kind: "email.send.v1", data: { n } }));
}
console.log("PUBLISHED");
queue.subscribe(bindConsumer(consumer, { db, laneBacklog: backlog }));
await queue.drain();
await queue.close();
await client.end();
console.log("DONE");
