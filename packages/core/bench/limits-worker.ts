/**
 * One worker process of bench/limits.bench.ts: a real consumer with
 * `limits: [provider("mail", { rate: 10, per: "1s" })]`, bound through the
 * harness on the bench's Postgres database with `upstashRateLimiter` over the
 * real `@upstash/redis` client (against the bench's REST shim), fed by the
 * in-process queue holding JOBS jobs. Its handler "calls the provider": one
 * HTTP POST to the bench's fake provider, then one ledger row in the work
 * transaction.
 *
 * Protocol on stdout/stdin: it prints `READY` once everything is connected
 * and its jobs are published (not yet subscribed), waits for a line
 * `START <startAt> <endAt>` (epoch ms), subscribes at startAt, closes the
 * queue at endAt (deliveries in flight finish), and prints one line
 *   DONE {"outcomes":{…},"grants":[…],"errors":[…]}
 * where `grants` are the decision instants (Date.now(), the same ms the
 * limiter reads for its decision) of the takes that got a token.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { createInterface } from "node:readline";
import { Redis } from "@upstash/redis";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import {
  type BoundConsumer,
  bindConsumer,
  createEnvelope,
  defineConsumer,
  provider,
  type RateLimiter,
} from "../src/index.ts";
import { upstashRateLimiter } from "../src/limits/upstash.ts";

const [databaseUrl, shimUrl, shimToken, prefix, providerUrl, worker, jobs, concurrency] = process.argv.slice(2);
if (!databaseUrl || !shimUrl || !shimToken || !prefix || !providerUrl || !worker || !jobs || !concurrency) {
  console.error("usage: limits-worker.ts DATABASE_URL SHIM_URL SHIM_TOKEN PREFIX PROVIDER_URL WORKER JOBS CONCURRENCY");
  process.exit(2);
}

const ledger = pgTable("bench_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

const sql = postgres(databaseUrl, { max: Number(concurrency), onnotice: () => {} });
const redis = new Redis({ url: shimUrl, token: shimToken });
// LIMITS_HEADROOM (inherited from the bench) overrides the limiter's default headroom.
const headroom = process.env["LIMITS_HEADROOM"];
const upstash = upstashRateLimiter({ redis, prefix, ...(headroom ? { headroom: Number(headroom) } : {}) });
// The real limiter, recording when each granted take was decided (nothing else
// changes), for the bench's report and for the delivery's handler to send along.
const grants: number[] = [];
const delivery = new AsyncLocalStorage<{ grantedAt?: number; answeredAt?: number }>();
const rateLimiter: RateLimiter = {
  async take(buckets) {
    const decidedAt = Date.now();
    const taken = await upstash.take(buckets);
    if (taken.ok) {
      grants.push(decidedAt);
      const store = delivery.getStore();
      if (store) {
        store.grantedAt = decidedAt;
        store.answeredAt = Date.now();
      }
    }
    return taken;
  },
  block: (bucket, forMs) => upstash.block(bucket, forMs),
};

const consumer = defineConsumer({
  name: "bench.mail",
  queue: "bench.mail",
  kind: "bench.mail.v1",
  schema: z.object({ to: z.string() }),
  limits: [provider("mail", { rate: 10, per: "1s" })],
  async handle(data, { tx, envelope, signal }) {
    const { grantedAt = "", answeredAt = "" } = delivery.getStore() ?? {};
    const query = `job=${envelope.job_id}&worker=${worker}&granted=${grantedAt}&answered=${answeredAt}&handler=${Date.now()}`;
    const response = await fetch(`${providerUrl}/send?${query}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ to: data.to }),
      signal,
    });
    await response.arrayBuffer();
    if (!response.ok) throw new Error(`provider answered ${response.status}`);
    await tx.insert(ledger).values({ jobId: envelope.job_id, amount: Number(worker) });
  },
});

const queue = createMemoryQueue({ concurrency: Number(concurrency) });
const outcomes: Record<string, number> = {};
const errors: string[] = [];
queue.onDelivery((event) => {
  outcomes[event.result.outcome] = (outcomes[event.result.outcome] ?? 0) + 1;
  if (event.result.outcome !== "success" && event.result.outcome !== "rate_limited" && errors.length < 20) {
    errors.push(`${event.result.outcome}: ${"error" in event.result ? event.result.error : ""}`);
  }
});
for (let i = 0; i < Number(jobs); i++) {
  await queue.publish(
    consumer.queue,
    createEnvelope({
      tenantId: `tenant-${worker}-${i % 10}`,
      kind: "bench.mail.v1",
      data: { to: `u${i}@example.com` },
    }),
  );
}
// Connections opened before the clock starts: the pool's, and the shim's (a PING touches no bucket).
await Promise.all(Array.from({ length: Number(concurrency) }, () => sql`select 1`));
await redis.ping();

console.log("READY");
const lines = createInterface({ input: process.stdin });
const start = await new Promise<string>((resolve) => lines.once("line", resolve));
lines.close();
const [, startAt, endAt] = start.split(" ").map(Number);
if (startAt === undefined || endAt === undefined || !Number.isFinite(startAt) || !Number.isFinite(endAt)) {
  console.error(`limits-worker: expected "START <startAt> <endAt>", got ${JSON.stringify(start)}`);
  process.exit(2);
}
await sleep(startAt - Date.now());
const bound = bindConsumer(consumer, { db: drizzle({ client: sql }), rateLimiter });
// The same bound consumer, each delivery in a context of its own where the take records its decision instant.
const deliver: BoundConsumer["deliver"] = (message) => delivery.run({}, () => bound.deliver(message));
queue.subscribe(
  new Proxy(bound, {
    get(target, property) {
      if (property === "deliver") return deliver;
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  }),
);
await sleep(endAt - Date.now());
await queue.close();
await sql.end({ timeout: 5 });
console.log(`DONE ${JSON.stringify({ outcomes, grants, errors })}`);
process.exit(0);
