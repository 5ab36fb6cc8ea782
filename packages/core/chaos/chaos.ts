// `pnpm chaos` (issue #12 item 1): the money rule under everything going
// wrong at once, on this machine. A throwaway Postgres cluster of its own
// (restarted once mid-run), the fake Vercel Queues server behind a hostile
// broker (dropped acks, early redeliveries, sends answered 202 — stored later
// or never — or 5xx), 3-4 worker processes polling it
// through the real @vercel/queue SDK (SIGKILLed at random and restarted, their
// backends terminated, a low idle_in_transaction_session_timeout for a while),
// handlers that fail, hang and rate-limit, a producer that publishes
// duplicates, poison, scheduled jobs and colliding ordering keys, and an
// operator bulk-replaying the exhausted letters while traffic flows. At the
// end, in SQL: every job has exactly one effect or exactly one pending letter;
// and from the workers' own records: no handler was given an attempt number
// above the runs of its job's handler so far (plus the deliveries the run's
// own faults cost it).
//
//   pnpm chaos [--seed N] [--long] [--jobs N] [--workers 3|4]
//
// The seed is printed first; the last line is the JSON summary. Exits 1 when
// anything was lost, doubled or fenced without its effect, an attempt number
// ran ahead of the handler's runs, or a worker died other than by the killer.
import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { appendFileSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { startThrowawayPostgres, type ThrowawayPostgres } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { createVercelQueue, toVercelReplayTopic, toVercelTopic } from "../src/adapters/vercel/index.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { createEnvelope, type Envelope, type PublishReceipt } from "../src/index.ts";
import { createOps } from "../src/ops/index.ts";
import { type FakeVercelQueues, startFakeVercelQueues } from "../test/fake-vercel-queues.ts";
import { checkAttempts } from "./attempts.ts";
import {
  CHAOS_CONSUMER,
  CHAOS_KIND,
  CHAOS_QUEUE,
  CHAOS_TABLES_SQL,
  CHAOS_TIMEOUT_MS,
  type ChaosData,
  type ChaosWorkerConfig,
} from "./consumer.ts";
import { type HostileBroker, startHostileBroker } from "./hostile-broker.ts";
import { type Random, seeded } from "./random.ts";
import { check, type Sent } from "./verdict.ts";

const { values: args } = parseArgs({
  options: {
    seed: { type: "string" },
    long: { type: "boolean", default: false },
    jobs: { type: "string" },
    workers: { type: "string" },
  },
  allowPositionals: true,
});

const seed = args.seed === undefined ? randomBytes(4).readUInt32BE(0) % 1_000_000_000 : Number(args.seed);
if (!Number.isSafeInteger(seed) || seed < 0) {
  console.error(`chaos: --seed must be a non-negative integer, got ${args.seed}`);
  process.exit(2);
}
const long = args.long === true;
const JOBS = args.jobs !== undefined ? Number(args.jobs) : long ? 20_000 : 1_500;
/** Wall time over which the producer spreads its jobs. */
const PRODUCE_MS = long ? Math.max(240_000, JOBS * 12) : Math.max(20_000, JOBS * 16);
const DRAIN_TIMEOUT_MS = long ? 1_200_000 : 180_000;
const WORKERS = args.workers !== undefined ? Number(args.workers) : 4;
/**
 * The fake broker's clock runs this many times faster than the wall clock:
 * Vercel's shortest lease is 30 s, so a killed worker's messages come back
 * after 3 s here instead of 30, and retry waits (>= 1 s) take a tenth.
 */
const SPEED = 10;
const LEASE_SECONDS = 30;
const CONCURRENCY = 4;
const CUSTOMERS = 25;
if (!(Number.isInteger(JOBS) && JOBS > 0) || !(WORKERS >= 3 && WORKERS <= 4)) {
  console.error("chaos: --jobs must be a positive integer and --workers 3 or 4");
  process.exit(2);
}

// One stream per agent, so that the producer's jobs are the same for a seed whatever the timing.
const random = seeded(seed);
const killerRandom = seeded(seed + 1);
const terminatorRandom = seeded(seed + 2);
const mode: "fast" | "immediate" = seed % 2 === 0 ? "fast" : "immediate";
const started = Date.now();
const log = (line: string) => console.log(`chaos [${((Date.now() - started) / 1000).toFixed(1)}s] ${line}`);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

console.log(
  `chaos: seed ${seed} (replay: pnpm chaos --seed ${seed}${long ? " --long" : ""}); ${JOBS} jobs over ${PRODUCE_MS / 1000} s, ${WORKERS} workers, Postgres restart mode ${mode}`,
);

/** What the producer sent, to be checked against the database at the end. */

interface Slot {
  readonly index: number;
  generation: number;
  child: ChildProcess | undefined;
  /** The killer sent SIGKILL to this child. */
  killedByUs: boolean;
  /** The delivery records of the current generation (`ChaosWorkerConfig.runLog`). */
  runLog: string;
}

const counters = {
  workerKills: 0,
  backendKills: 0,
  pgRestarts: 0,
  unexpectedExits: [] as string[],
  replayed: 0,
  outcomes: {} as Record<string, number>,
  /** Producer publishes answered 202 (not known stored), published again. */
  publishedAgain: 0,
};

/** The workers' stderr: kept when the run fails, removed when it passes. */
const logFile = join(tmpdir(), `softcrum-chaos-${seed}-${process.pid}.log`);
/** The workers' delivery records, one file per worker process: kept when the run fails, removed when it passes. */
const runDir = join(tmpdir(), `softcrum-chaos-${seed}-${process.pid}-runs`);
/** When the killer (or the stop's last resort) SIGKILLed the worker writing each record file. */
const killedAt = new Map<string, number>();
let pg: ThrowawayPostgres | undefined;
let fake: FakeVercelQueues | undefined;
let broker: HostileBroker | undefined;
let clockTicker: NodeJS.Timeout | undefined;
const slots: Slot[] = [];
let stopping = false;

async function main(): Promise<number> {
  pg = await startThrowawayPostgres({
    migrate: migrateCore,
    // The throwaway cluster trades durability for speed (synchronous_commit
    // off): an immediate shutdown would then lose commits already
    // acknowledged — the cluster's fault, not the harness's. On here; fsync
    // may stay off, since only Postgres crashes, never the machine.
    settings: { max_connections: 100, synchronous_commit: "on" },
  });
  const cluster = pg;
  writeFileSync(logFile, "");
  mkdirSync(runDir, { recursive: true });
  log(`Postgres on port ${cluster.port} (${cluster.dir})`);
  await withClient(cluster.url, (sql) => sql.unsafe(CHAOS_TABLES_SQL));

  fake = await startFakeVercelQueues();
  const broker_ = await startHostileBroker({
    upstream: fake.url,
    token: fake.clientOptions().token,
    random: seeded(seed ^ 0x5bd1e995),
    replayTopics: [toVercelReplayTopic(CHAOS_QUEUE, CHAOS_CONSUMER)],
  });
  broker = broker_;
  log(`broker rates ${JSON.stringify(broker_.stats.rates)}`);
  const fakeServer = fake;
  // The fake's clock only moves when told: it follows the wall clock, SPEED times faster.
  const fakeStart = fakeServer.clock.now();
  clockTicker = setInterval(() => fakeServer.clock.advanceTo(fakeStart + (Date.now() - started) * SPEED), 10);
  const topic = toVercelTopic(CHAOS_QUEUE);
  const group = toVercelTopic(CHAOS_CONSUMER);
  const replayTopic = toVercelReplayTopic(CHAOS_QUEUE, CHAOS_CONSUMER);

  // Workers.
  const workerScript = fileURLToPath(new URL("./worker.ts", import.meta.url));
  const coreDir = fileURLToPath(new URL("..", import.meta.url));
  const startWorker = (slot: Slot) => {
    slot.generation += 1;
    slot.killedByUs = false;
    const client = `${slot.index}.${slot.generation}`;
    slot.runLog = join(runDir, `worker-${client}.jsonl`);
    const config: ChaosWorkerConfig = {
      index: slot.index,
      workerSeed: (seed * 31 + slot.index * 7919 + slot.generation * 104_729) >>> 0,
      databaseUrl: cluster.url,
      // Named in its path: the broker records which worker received each lease.
      brokerUrl: `${broker_.url}/w/${client}`,
      token: fakeServer.clientOptions().token,
      visibilityTimeoutSeconds: LEASE_SECONDS,
      concurrency: CONCURRENCY,
      timeoutMs: CHAOS_TIMEOUT_MS,
      // The last slot runs on node-postgres: both drivers of the engine under the same faults.
      driver: slot.index === WORKERS - 1 && WORKERS > 1 ? "node-postgres" : "postgres.js",
      // Every other slot batches its deliveries (#23): killed mid-batch too, on both drivers;
      // slot 1's handlers run concurrently (rolled back and run again one after another on any failure).
      ...(slot.index % 2 === 1
        ? { batch: { maxSize: CONCURRENCY, maxWaitMs: 5, ...(slot.index === 1 ? { concurrent: true } : {}) } }
        : {}),
      runLog: slot.runLog,
    };
    const child = spawn(process.execPath, ["--import", "tsx", workerScript, JSON.stringify(config)], {
      cwd: coreDir,
      stdio: ["ignore", "pipe", "pipe"],
    });
    slot.child = child;
    const name = `worker ${slot.index}.${slot.generation}`;
    let last: Record<string, number> = {};
    let buffered = "";
    child.stdout?.on("data", (chunk: Buffer) => {
      buffered += chunk.toString();
      const lines = buffered.split("\n");
      buffered = lines.pop() ?? "";
      for (const line of lines) {
        if (line.startsWith("STATS ")) last = JSON.parse(line.slice(6)) as Record<string, number>;
      }
    });
    child.stderr?.on("data", (chunk: Buffer) => appendFileSync(logFile, `[${name}] ${chunk.toString()}`));
    child.on("exit", (code, signal) => {
      for (const [outcome, n] of Object.entries(last))
        counters.outcomes[outcome] = (counters.outcomes[outcome] ?? 0) + n;
      if (slot.child === child) slot.child = undefined;
      const byKiller = slot.killedByUs && signal === "SIGKILL";
      const byUsAtEnd = stopping && code === 0;
      if (!byKiller && !byUsAtEnd) {
        counters.unexpectedExits.push(`${name} exited with ${code ?? signal}`);
        log(`UNEXPECTED: ${name} exited with ${code ?? signal} (see ${logFile})`);
      }
      if (!stopping) setTimeout(() => !stopping && !slot.child && startWorker(slot), killerRandom.int(100, 400));
    });
  };
  for (let index = 0; index < WORKERS; index++) {
    const slot: Slot = { index, generation: 0, child: undefined, killedByUs: false, runLog: "" };
    slots.push(slot);
    startWorker(slot);
  }

  // The producer publishes through the adapter and the hostile broker: some
  // of its publishes are answered 202 (stored later, or never) or 5xx.
  const producer = createVercelQueue({
    ...fakeServer.clientOptions(),
    resolveBaseUrl: () => new URL(broker_.url),
    clock: fakeServer.clock,
    env: {},
    logger: { warn: () => {}, error: () => {} },
  });
  const opsPool = postgres(cluster.url, {
    max: 3,
    connect_timeout: 3,
    backoff: () => 0.2,
    onnotice: () => {},
    connection: { application_name: "chaos-operator" },
  });
  const ops = createOps({
    db: drizzle({ client: opsPool }),
    // Replays go out on the Vercel adapter's replay lane, to the one consumer.
    queue: producer,
    routes: [{ queue: CHAOS_QUEUE, consumer: CHAOS_CONSUMER }],
    // One operator, no approver needed; a short lease so a run broken by the
    // Postgres restart is taken over by the next one at once.
    batchPolicy: { approvalThreshold: 1_000_000, leaseMs: 2_000, pollIntervalMs: 100 },
  });

  const sent: Sent = { jobs: new Map(), garbage: new Set() };
  let produced = false;
  const agents: Promise<void>[] = [];
  let failedAgents = 0;
  const during = (what: string, agent: () => Promise<void>) =>
    agents.push(
      agent().catch((error: unknown) => {
        failedAgents += 1;
        log(`PROBLEM ${what} failed: ${String(error)}`);
      }),
    );

  // The killer: a random worker SIGKILLed every ~2 s, restarted when it is gone.
  during("killer", async () => {
    await sleep(2_000);
    while (!produced) {
      const live = slots.filter((s) => s.child && s.child.exitCode === null && !s.killedByUs);
      if (live.length > 0) {
        const slot = killerRandom.pick(live);
        slot.killedByUs = true;
        killedAt.set(slot.runLog, Date.now());
        slot.child?.kill("SIGKILL");
        counters.workerKills += 1;
      }
      await sleep(killerRandom.int(1_500, 2_500));
    }
  });
  // The terminator: random worker backends, in a transaction or not.
  during("terminator", async () => {
    await sleep(1_000);
    while (!produced) {
      const slot = terminatorRandom.pick(slots);
      try {
        const pids = await cluster.terminateBackends(`chaos-worker-${slot.index}`, {
          inTransaction: terminatorRandom.chance(0.6),
        });
        counters.backendKills += pids.length;
      } catch (error) {
        if (process.env["CHAOS_DEBUG"]) log(`terminator: ${String(error)}`);
      } // the server is restarting
      await sleep(terminatorRandom.int(500, 1_200));
    }
  });
  // Postgres restarts once, a third of the way in; the idle-in-transaction timeout drops for 5 s later.
  during("restarter", async () => {
    await sleep(PRODUCE_MS * 0.35);
    log(`restarting Postgres (${mode} shutdown)`);
    await cluster.restart({ mode });
    counters.pgRestarts += 1;
    log("Postgres is back");
  });
  during("idle timeout", async () => {
    await sleep(PRODUCE_MS * 0.6);
    await withClient(cluster.url, async (sql) => {
      await sql`alter system set idle_in_transaction_session_timeout = '120ms'`;
      await sql`select pg_reload_conf()`;
    });
    log("idle_in_transaction_session_timeout is 120 ms for 5 s");
    await sleep(5_000);
    await withClient(cluster.url, async (sql) => {
      await sql`alter system reset idle_in_transaction_session_timeout`;
      await sql`select pg_reload_conf()`;
    });
  });
  // The operator: repairs what made the exhausted letters fail, then bulk-replays them, while traffic flows.
  const exhaustedLetters = async () => {
    const [row] = await opsPool<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters
      where consumer = ${CHAOS_CONSUMER} and status = 'pending_review' and error_class = 'exhausted'`;
    return row?.n ?? 0;
  };
  const operatorPass = async (label: string, waitMs: number) => {
    // Letters come late when the fleet has a backlog: wait for the first ones.
    for (const deadline = Date.now() + waitMs; Date.now() < deadline; ) {
      if ((await exhaustedLetters().catch(() => 0)) > 0) break;
      await sleep(500);
    }
    const repaired = await opsPool`
      insert into chaos_repaired (job_id)
      select job_id::uuid from core.dead_letters
      where consumer = ${CHAOS_CONSUMER} and status = 'pending_review' and error_class = 'exhausted' and job_id is not null
      on conflict do nothing`;
    if ((await exhaustedLetters()) === 0) {
      log(`operator ${label}: no exhausted letter to replay`);
      return;
    }
    const batch = await ops.batches.create({
      filter: { consumer: CHAOS_CONSUMER, errorClass: "exhausted" },
      operator: "chaos-operator",
      reason: `chaos ${label}: the downstream service is repaired`,
      ratePerSecond: 200,
      batchSize: 25,
      maxFailureRate: 1,
    });
    for (let tries = 0; ; tries++) {
      try {
        const done = await ops.batches.run(batch.id, { operator: "chaos-operator" });
        counters.replayed += done.replayed;
        log(
          `operator ${label}: ${repaired.count} jobs repaired, batch of ${done.selected} exhausted letters ${done.status} (${done.replayed} replayed)`,
        );
        return;
      } catch (error) {
        if (tries >= 20) throw error;
        await sleep(2_500); // the batch's lease (2 s) runs out, then this run takes it over
      }
    }
  };
  // From half-way through the production until the queue has drained, the
  // operator replays whatever exhausted letters there are, every few seconds
  // (they come late when the fleet has a backlog: each attempt waits behind it).
  let operatorStop = false;
  let operatorRounds = 0;
  const operator = (async () => {
    await sleep(PRODUCE_MS * 0.5);
    let failedRounds = 0;
    while (!operatorStop) {
      if ((await exhaustedLetters().catch(() => 0)) > 0) {
        operatorRounds += 1;
        try {
          await operatorPass(`round ${operatorRounds}${produced ? " (backlog draining)" : " (mid-run)"}`, 0);
          failedRounds = 0;
        } catch (error) {
          // The run's own Postgres faults (its restart, the 120 ms idle-in-
          // transaction timeout) may end a round's connection; a replay the
          // broker answers 202 or 5xx pauses its batch, so rounds are many.
          // An operator runs the command again; five failures in a row fail the run.
          failedRounds += 1;
          if (failedRounds >= 5) throw error;
          log(`operator round ${operatorRounds} failed (${String(error)}); the next round tries again`);
        }
      }
      await sleep(2_000);
    }
  })().catch((error: unknown) => {
    failedAgents += 1;
    log(`PROBLEM operator failed: ${String(error)}`);
  });

  // The producer.
  const customers = Array.from({ length: CUSTOMERS }, (_, i) => `customer-${i}`);
  const publish = async (n: number) => {
    const r = random.next();
    if (r < 0.005) {
      // Another stack's garbage: no envelope at all.
      const bytes = Buffer.concat([Buffer.from(`garbage ${seed} ${n} `), Buffer.from(randomOf(random, 16))]);
      sent.garbage.add(createHash("sha256").update(bytes).digest("hex"));
      fakeServer.inject(topic, bytes);
      return;
    }
    // Most of the jobs that fail until repaired come early: each of their 5
    // attempts waits behind the backlog, and the operator's mid-run pass
    // should find their letters.
    const exhaust = n < JOBS * 0.2 ? 0.06 : 0.01;
    const fate: ChaosData["fate"] | "poison" =
      r < 0.01 ? "poison" : r < 0.01 + exhaust ? "exhaust" : r < 0.02 + exhaust ? "permanent" : "ok";
    const data =
      fate === "poison"
        ? { customer: "", points: -random.int(1, 9), fate: "ok" }
        : { customer: random.pick(customers), points: random.int(1, 100), fate };
    const envelope: Envelope = createEnvelope({ tenantId: "chaos", kind: CHAOS_KIND, data });
    const copies = random.chance(0.2) ? 2 : 1;
    sent.jobs.set(envelope.job_id, { fate, copies });
    const scheduled = random.chance(0.03);
    const runAt = new Date(fakeServer.clock.now() + random.int(5, 60) * 1000);
    const delayMs = random.int(0, 20_000);
    const first = stored(() =>
      scheduled ? producer.schedule(CHAOS_QUEUE, envelope, runAt) : producer.publish(CHAOS_QUEUE, envelope),
    );
    const second = copies === 2 ? stored(() => producer.publish(CHAOS_QUEUE, envelope, { delayMs })) : null;
    await Promise.all([first, second]);
  };
  let n = 0;
  const produceStart = Date.now();
  while (n < JOBS) {
    const due = Math.min(JOBS, Math.ceil((JOBS * (Date.now() - produceStart)) / PRODUCE_MS));
    const batch: Promise<void>[] = [];
    for (; n < due; n++) batch.push(publish(n));
    await Promise.all(batch);
    await sleep(50);
  }
  log(`produced ${sent.jobs.size + sent.garbage.size} jobs`);
  // The killers stop; the operator's second pass runs while the backlog still flows.
  produced = true;
  await Promise.all(agents);

  // Drain: the broker stays hostile (dropped acks come back as duplicates).
  const drainStart = Date.now();
  let quietSince: number | undefined;
  let drained = false;
  while (Date.now() - drainStart < DRAIN_TIMEOUT_MS) {
    // A send answered 202 and stored later may still be on its way.
    const pending = fakeServer.pending(topic, group) + fakeServer.pending(replayTopic, group) + broker_.pendingSends();
    if (pending === 0) {
      quietSince ??= Date.now();
      if (Date.now() - quietSince >= 2_000) {
        // The operator's last pass may publish replays: drained only if none.
        if (!operatorStop) {
          operatorStop = true;
          await operator;
          quietSince = undefined;
          continue;
        }
        drained = true;
        break;
      }
    } else quietSince = undefined;
    await sleep(250);
  }
  operatorStop = true;
  await operator;
  if (operatorRounds === 0) log("operator: no exhausted letter appeared before the queue drained");
  log(
    drained ? "drained" : `NOT drained after ${DRAIN_TIMEOUT_MS / 1000} s: ${fakeServer.pending(topic, group)} pending`,
  );

  // Stop the fleet: each worker finishes its deliveries and exits 0.
  stopping = true;
  await Promise.all(
    slots.map(
      (slot) =>
        new Promise<void>((resolve) => {
          const child = slot.child;
          if (!child || child.exitCode !== null) return resolve();
          const dump = setTimeout(() => {
            withClient(
              cluster.url,
              (sql) => sql`
              select pid, state, wait_event_type, wait_event, now() - xact_start as xact_age,
                     now() - state_change as state_age, left(query, 200) as query
              from pg_stat_activity where application_name = ${`chaos-worker-${slot.index}`}`,
            )
              .then((rows) =>
                appendFileSync(
                  logFile,
                  `[worker ${slot.index}] not stopped after 5 s; its backends: ${JSON.stringify(rows)}\n`,
                ),
              )
              .catch(() => {});
          }, 5_000);
          const timer = setTimeout(() => {
            killedAt.set(slot.runLog, Date.now());
            child.kill("SIGKILL");
          }, 15_000);
          child.once("exit", () => {
            clearTimeout(timer);
            clearTimeout(dump);
            resolve();
          });
          child.kill("SIGTERM");
        }),
    ),
  );
  await opsPool.end({ timeout: 5 });
  await producer.close();

  // The money rule, in SQL.
  const verdict = await withClient(cluster.url, (sql) => check(sql, sent));
  for (const jobId of verdict.lostJobs.slice(0, 3)) log(`FORENSICS ${forensics(jobId, fakeServer, broker_)}`);
  // Attempts never above handler runs, from the workers' records.
  const attempts = checkAttempts(fakeServer, broker_.events, runDir, killedAt);
  log(
    `handler runs ${attempts.runs} of ${attempts.jobs} jobs; deliveries the run's faults cost (credited) ${JSON.stringify(attempts.credits)}; attempt numbers above the runs: ${attempts.overRuns} runs of ${attempts.overJobs} jobs`,
  );
  for (const jobId of attempts.overJobIds.slice(0, 3))
    log(`FORENSICS attempts ${attempts.timeline(jobId)} ${forensics(jobId, fakeServer, broker_)}`);
  if (process.env["CHAOS_DEBUG"]) {
    const sample = [...sent.jobs].find(([, job]) => job.fate === "exhaust")?.[0];
    if (sample) log(`DEBUG an exhaust job: ${forensics(sample, fakeServer, broker_)}`);
  }
  log(
    `outcomes ${JSON.stringify(counters.outcomes)}; broker ${JSON.stringify(broker_.stats)}; replayed ${counters.replayed}; producer publishes answered 202 and published again ${counters.publishedAgain}`,
  );
  for (const line of verdict.problems.slice(0, 20)) log(`PROBLEM ${line}`);
  for (const line of attempts.problems.slice(0, 20)) log(`PROBLEM ${line}`);
  for (const line of counters.unexpectedExits) log(`PROBLEM ${line}`);
  const summary = {
    jobs: sent.jobs.size + sent.garbage.size,
    effects: verdict.effects,
    dead_letters: verdict.deadLetters,
    lost: verdict.lost,
    doubled: verdict.doubled,
    orphan_fences: verdict.orphanFences,
    attempts_over_runs: attempts.overJobs,
    worker_kills: counters.workerKills,
    backend_kills: counters.backendKills,
    pg_restarts: counters.pgRestarts,
    seconds: Math.round((Date.now() - started) / 100) / 10,
  };
  const ok =
    summary.lost === 0 &&
    summary.doubled === 0 &&
    summary.orphan_fences === 0 &&
    summary.attempts_over_runs === 0 &&
    counters.unexpectedExits.length === 0 &&
    verdict.problems.length === 0 &&
    drained &&
    failedAgents === 0;
  if (!ok) log(`FAILED: replay with pnpm chaos --seed ${seed}${long ? " --long" : ""}; worker logs in ${logFile}`);
  if (!ok) log(`the workers' delivery records are in ${runDir}`);
  if (ok) {
    rmSync(logFile, { force: true });
    rmSync(runDir, { recursive: true, force: true });
  }
  console.log(JSON.stringify(summary));
  return ok ? 0 : 1;
}

/** What the fake server and the broker saw of a job's messages. */
function forensics(jobId: string, fake: FakeVercelQueues, broker: HostileBroker): string {
  const sends = fake.sends.filter((s) => s.body.includes(jobId));
  const ids = new Set(sends.map((s) => s.messageId));
  const group = toVercelTopic(CHAOS_CONSUMER);
  return JSON.stringify({
    jobId,
    sends: sends.map((s) => ({
      order: s.order,
      messageId: s.messageId,
      deduplicated: s.deduplicated,
      delaySeconds: s.delaySeconds,
      key: s.idempotencyKey,
      deferral: s.body.subarray(0, 24).toString().startsWith('{"softcrum_deferral"'),
      deliveries: fake.deliveryCount(s.topic, group, s.messageId),
    })),
    leaseCalls: fake.leaseCalls.filter((c) => ids.has(c.messageId)),
    broker: broker.events.filter(
      (e) => (e.messageId !== undefined && ids.has(e.messageId)) || (e.jobId !== undefined && e.jobId === jobId),
    ),
  });
}

async function retried<T>(publish: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await publish();
    } catch (error) {
      if (attempt >= 5) throw error;
      await sleep(50 * attempt);
    }
  }
}

/**
 * A publish the service answered 202 ("accepted for deferred processing", no
 * id: `stored: false`) is not known stored — it may be stored later, or
 * never — so the producer publishes the same envelope again until a send is
 * stored (the library's contract: the fence absorbs a copy stored after all).
 */
async function stored(publish: () => Promise<PublishReceipt>): Promise<void> {
  for (let tries = 1; ; tries++) {
    const receipt = await retried(publish);
    if (receipt.stored) return;
    counters.publishedAgain += 1;
    if (tries >= 10) throw new Error(`a publish was answered 202 ${tries} times in a row`);
  }
}

function randomOf(random: Random, length: number): Uint8Array {
  return Uint8Array.from({ length }, () => random.int(0, 255));
}

async function withClient<T>(url: string, work: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 5 });
  try {
    return await work(sql);
  } finally {
    await sql.end({ timeout: 2 });
  }
}

async function cleanup(): Promise<void> {
  stopping = true;
  if (clockTicker) clearInterval(clockTicker);
  for (const slot of slots) if (slot.child && slot.child.exitCode === null) slot.child.kill("SIGKILL");
  await broker?.close().catch(() => {});
  await fake?.close().catch(() => {});
  await pg?.stop();
}

let code = 1;
try {
  code = await main();
} catch (error) {
  console.error(`chaos: the run itself failed (seed ${seed}):`, error);
  code = 1;
} finally {
  await cleanup();
}
process.exit(code);
