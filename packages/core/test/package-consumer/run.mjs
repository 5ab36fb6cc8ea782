// Run by package-install.test.ts with plain `node` in a scratch project that
// installed the packed tarball from npm (no workspace links, no TypeScript
// loader): migrates a fresh database, binds a consumer to the in-process
// queue, delivers a job and a duplicate of it, and prints what it saw.
//   node run.mjs DATABASE_URL
import { bindConsumer, createEnvelope, defineConsumer } from "@softcrum/core";
import { createMemoryQueue } from "@softcrum/core/adapters/memory";
import { migrateCore } from "@softcrum/core/migrate";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";

const url = process.argv[2];
if (!url) throw new Error("usage: node run.mjs DATABASE_URL");

const migrated = await migrateCore(url);
const client = postgres(url, { max: 4, onnotice: () => {} });
await client`create table ledger (job_id uuid primary key, customer_id text not null, points int not null)`;

const awardPoints = defineConsumer({
  name: "scratch.award-points",
  queue: "scratch.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number().int().positive() }),
  async handle(data, { tx, envelope }) {
    await tx.execute(
      sql`insert into ledger (job_id, customer_id, points) values (${envelope.job_id}, ${data.customerId}, ${data.points})`,
    );
  },
});

const outcomes = [];
const bound = bindConsumer(awardPoints, {
  db: drizzle({ client }),
  metrics: {
    jobProcessed: ({ outcome }) => outcomes.push(outcome),
    handlerDuration() {},
    alertFailed() {},
  },
});
const queue = createMemoryQueue();
queue.subscribe(bound);
const job = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId: "c1", points: 10 } });
await queue.publish("scratch.points", job);
await queue.drain();
await queue.publish("scratch.points", job); // the at-least-once copy
await queue.drain();

const rows = await client`select customer_id, points from ledger`;
const fences = await client`select count(*)::int as n from core.processed_jobs where job_id = ${job.job_id}`;
await queue.close();
await client.end();
console.log(JSON.stringify({ applied: migrated.applied.length, outcomes, rows, fences: fences[0].n }));
