// One worker process of the chaos run (chaos.ts starts 3-4 of them and kills
// them at random): the harness on a postgres.js pool (or a node-postgres one,
// `config.driver`), fed by the Vercel
// adapter's poll loop through the real @vercel/queue SDK, against the fake
// Vercel Queues server behind the run's hostile broker. Its handler writes
// the job's effect through `tx` (a `preparedQuery` copy) and then meets faults drawn from the run's seed. It prints `STATS <json>` (outcome counts) every
// second, and exits 0 on SIGTERM once its deliveries in flight have ended.
// It appends each delivery's receipt, handler start (with `ctx.attempt`) and
// end to `config.runLog` as they happen, for the run's "attempts never above
// handler runs" check.
import { AsyncLocalStorage } from "node:async_hooks";
import { appendFileSync } from "node:fs";
import { sql } from "drizzle-orm";
import { drizzle as drizzleNodePg } from "drizzle-orm/node-postgres";
import { integer, pgTable, text, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import pg from "pg";
import postgres from "postgres";
import { createVercelQueue, type VercelDeliveryEvent } from "../src/adapters/vercel/index.ts";
import {
  type BoundConsumer,
  bindConsumer,
  type HandlerContext,
  PermanentError,
  preparedQuery,
  RateLimitedError,
} from "../src/index.ts";
import { TEST_QUEUE_SECRET } from "../test/fake-vercel-queues.ts";
import {
  CHAOS_CONSUMER,
  type ChaosData,
  type ChaosWorkerConfig,
  chaosConsumer,
  type DeliveryRecord,
} from "./consumer.ts";
import { seeded } from "./random.ts";

const config = JSON.parse(process.argv[2] ?? "{}") as ChaosWorkerConfig;
const applicationName = `chaos-worker-${config.index}`;

const pool = postgres(config.databaseUrl, {
  max: config.concurrency + 2,
  connect_timeout: 3,
  // Reconnect within 0.2 s after a failure (postgres.js waits up to 20 s by
  // default): the same recovery, on the run's time scale.
  backoff: () => 0.2,
  connection: { application_name: applicationName },
  onnotice: () => {},
});
// Counts reserve() and begin() calls still waiting, for a worker that does not stop.
const waiting = { reserve: 0, begin: 0 };
const reserve = pool.reserve.bind(pool);
pool.reserve = async () => {
  waiting.reserve += 1;
  try {
    return await reserve();
  } finally {
    waiting.reserve -= 1;
  }
};
// begin() calls not settled: whether their callback ever got a connection.
const begins = new Map<object, { since: number; started: boolean; ended: boolean }>();
const begin = pool.begin.bind(pool) as (...args: unknown[]) => Promise<unknown>;
(pool as unknown as { begin: unknown }).begin = (...args: unknown[]) => {
  const key = {};
  const record = { since: Date.now(), started: false, ended: false };
  begins.set(key, record);
  const fn = args[args.length - 1] as (tx: unknown) => Promise<unknown>;
  args[args.length - 1] = async (tx: unknown) => {
    record.started = true;
    try {
      return await fn(tx);
    } finally {
      record.ended = true;
    }
  };
  return begin(...args).finally(() => begins.delete(key));
};
// A node-postgres worker runs the same harness through the engine's other driver.
const nodePool =
  config.driver === "node-postgres"
    ? new pg.Pool({
        connectionString: config.databaseUrl,
        max: config.concurrency + 2,
        connectionTimeoutMillis: 3_000,
        application_name: applicationName,
      })
    : undefined;
// A client whose backend the run terminated: the pool replaces it.
nodePool?.on("error", () => {});
const db = nodePool ? drizzleNodePg({ client: nodePool }) : drizzle({ client: pool });
// Each process (and each restart of it) draws its own faults from the run's seed.
const random = seeded(config.workerSeed);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function jobIdOf(body: unknown): string | undefined {
  try {
    const text = typeof body === "string" ? body : Buffer.from(body as Uint8Array).toString("utf8");
    return (JSON.parse(text) as { job_id?: string }).job_id;
  } catch {
    return undefined;
  }
}

/**
 * Appended synchronously (one write each), before the work it announces: once
 * the call returns the line is the kernel's, and a SIGKILL of this process
 * does not take it back.
 */
const logDelivery = (line: DeliveryRecord) => appendFileSync(config.runLog, `${JSON.stringify(line)}\n`);
/** The delivery a handler runs for (its number in this process), through the harness's async calls. */
const deliveryOf = new AsyncLocalStorage<number>();
let deliveries = 0;
/** The job of each message this process handed to the harness, for its incidents. */
const jobOfMessage = new Map<string, string>();

const consumer = chaosConsumer(async (data, ctx) => {
  // Counted as it starts: a run the killer ends half-way was still a run.
  logDelivery({ e: "run", d: deliveryOf.getStore(), t: Date.now(), job: ctx.envelope.job_id, a: ctx.attempt });
  const stage = stageOf.get(ctx.envelope.job_id);
  if (stage) stage.stage = "handler";
  try {
    await handle(data, ctx);
  } finally {
    if (stage) stage.stage = "after handler";
  }
}, config.batch);

const chaosEffects = pgTable("chaos_effects", {
  jobId: uuid("job_id").notNull(),
  consumer: text("consumer").notNull(),
  customer: text("customer").notNull(),
  amount: integer("amount").notNull(),
});
/** The effect, built once and bound to each job's tx (#23): the copies meet every kill and restart of the run. */
const insertEffect = preparedQuery("chaos_effect", (tx) =>
  tx.insert(chaosEffects).values({
    jobId: sql.placeholder("jobId"),
    consumer: CHAOS_CONSUMER,
    customer: sql.placeholder("customer"),
    amount: sql.placeholder("amount"),
  }),
);

async function handle(data: ChaosData, { tx, envelope }: HandlerContext): Promise<void> {
  // The operator fixed what made this job fail before replaying it (chaos.ts
  // records that here): it runs clean from then on.
  const repaired = (await tx.execute(sql`select 1 from chaos_repaired where job_id = ${envelope.job_id}`)) as unknown[];
  const clean = repaired.length > 0;
  if (!clean && data.fate === "permanent") throw new PermanentError("chaos: the customer account is closed");
  if (!clean && data.fate === "exhaust") throw new Error("chaos: the downstream service keeps failing");
  await insertEffect(tx).execute({ jobId: envelope.job_id, customer: data.customer, amount: data.points });
  // The customer's running balance: deliveries with the same ordering key
  // (the customer) are serialised by the harness, so this never deadlocks.
  await tx.execute(
    sql`insert into chaos_balances (customer, points) values (${data.customer}, ${data.points})
        on conflict (customer) do update set points = chaos_balances.points + excluded.points`,
  );
  if (clean) return;
  // Faults after the write: the transaction must roll it back.
  const r = random.next();
  if (r < 0.25) throw new Error("chaos: transient downstream failure");
  if (r < 0.28) throw new RateLimitedError("chaos: provider answered 429", { retryAfterMs: 300 });
  if (r < 0.295) {
    // Hangs past the handler's timeout, deaf to its signal.
    await sleep(config.timeoutMs + 400);
    return;
  }
  if (r < 0.32) {
    // An error whose code says "connection reset" and says nothing about the
    // harness's own connection (SPEC §4: only its connection state counts).
    throw Object.assign(new Error("chaos: socket hang up"), { code: "ECONNRESET" });
  }
  // Idle in transaction for a while (the terminator and the low
  // idle_in_transaction_session_timeout find it here), or busy in a statement.
  if (r < 0.36) await sleep(250);
  else if (r < 0.4) await tx.execute(sql`select pg_sleep(0.15)`);
}

const harness = bindConsumer(consumer, {
  db,
  logger: { warn: () => {}, error: () => {} },
});
// Deliveries in flight, so that a worker that does not stop can say which ones hold it.
const inFlight = new Map<
  object,
  { messageId: string | undefined; count: number; since: number; stage: string; outcome?: string }
>();
const stageOf = new Map<string, { stage: string }>();
// Everything the harness offers a transport, but its deliveries go through
// the worker's bookkeeping: the dead letter written now (a copy the service
// would drop), the bounds, the transport holds (a delivery kept on its lease
// without spending an attempt), the alerts' flush.
const bound: BoundConsumer = {
  name: harness.name,
  queue: harness.queue,
  ...(harness.timeoutMs !== undefined ? { timeoutMs: harness.timeoutMs } : {}),
  ...(harness.deliveryBoundMs !== undefined ? { deliveryBoundMs: harness.deliveryBoundMs } : {}),
  ...(harness.maxAttempts !== undefined ? { maxAttempts: harness.maxAttempts } : {}),
  ...(harness.holds !== undefined ? { holds: harness.holds } : {}),
  ...(harness.deadLetterNow ? { deadLetterNow: harness.deadLetterNow.bind(harness) } : {}),
  ...(harness.flushAlerts ? { flushAlerts: harness.flushAlerts.bind(harness) } : {}),
  async deliver(delivery) {
    const key = {};
    const record = {
      messageId: delivery.messageId,
      count: delivery.deliveryCount,
      since: Date.now(),
      stage: "harness",
    };
    inFlight.set(key, record);
    const jobId = jobIdOf(delivery.body);
    if (jobId) stageOf.set(jobId, record);
    const d = ++deliveries;
    if (jobId && delivery.messageId !== undefined) jobOfMessage.set(delivery.messageId, jobId);
    if (jobId)
      logDelivery({
        e: "recv",
        d,
        t: Date.now(),
        job: jobId,
        msg: delivery.messageId ?? "",
        n: delivery.deliveryCount,
      });
    let outcome = "thrown";
    try {
      const result = await deliveryOf.run(d, () => harness.deliver(delivery));
      outcome = result.outcome;
      return result;
    } finally {
      inFlight.delete(key);
      if (jobId && stageOf.get(jobId) === record) stageOf.delete(jobId);
      if (jobId) logDelivery({ e: "end", d, t: Date.now(), o: outcome });
    }
  },
};
const queue = createVercelQueue({
  region: "iad1",
  token: config.token,
  deploymentId: null,
  resolveBaseUrl: () => new URL(config.brokerUrl),
  visibilityTimeoutSeconds: config.visibilityTimeoutSeconds,
  wrapperSecret: TEST_QUEUE_SECRET,
  env: {},
  logger: { warn: () => {}, error: () => {} },
  // Recorded with the deliveries: a hold the adapter could not record makes
  // the message's next delivery count as an attempt, as it documents.
  onIncident: (incident) =>
    logDelivery({
      e: "incident",
      t: Date.now(),
      kind: incident.kind,
      msg: incident.messageId,
      job: incident.messageId !== undefined ? jobOfMessage.get(incident.messageId) : undefined,
    }),
});
const outcomes: Record<string, number> = {};
queue.onDelivery((event: VercelDeliveryEvent) => {
  const key = event.result.outcome;
  outcomes[key] = (outcomes[key] ?? 0) + 1;
  // The adapter has answered the service for this delivery (republished,
  // held, acknowledged or moved its lease): a kill from now on costs it nothing.
  if (jobOfMessage.has(event.messageId))
    logDelivery({
      e: "settled",
      t: Date.now(),
      msg: event.messageId,
      action: event.action,
      applied: event.applied !== false,
    });
});
const worker = queue.startWorker(bound, { concurrency: config.concurrency, idleDelayMs: 100, errorDelayMs: 200 });
const report = () => process.stdout.write(`STATS ${JSON.stringify(outcomes)}\n`);
const ticker = setInterval(report, 1_000);
process.stdout.write("READY\n");

let stopping = false;
process.on("SIGTERM", () => {
  if (stopping) return;
  stopping = true;
  void (async () => {
    clearInterval(ticker);
    const watchdog = setInterval(() => {
      const now = Date.now();
      const stuck = [...inFlight.values()].map((d) => ({ ...d, since: `${now - d.since} ms ago` }));
      const beginning = [...begins.values()].map((b) => ({ ...b, since: `${now - b.since} ms ago` }));
      process.stderr.write(
        `STOPPING for a while: ${worker.inFlight} lanes busy, ${waiting.reserve} reserve() waiting, deliveries in flight ${JSON.stringify(stuck)}, begin() calls ${JSON.stringify(beginning)}\n`,
      );
    }, 3_000);
    watchdog.unref();
    await worker.stop();
    await queue.close();
    await pool.end({ timeout: 5 });
    await nodePool?.end();
    report();
    process.exit(0);
  })();
});
