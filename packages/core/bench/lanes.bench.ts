/**
 * Notification lanes (#20 item 2 goals; ADR 0011): a marketing consumer
 * yields to its channel's transactional backlog, and transactional latency
 * does not suffer from the marketing traffic beside it. On a throwaway
 * Postgres database, through the harness (`bindConsumer`) and the in-process
 * queue on the real clock, with one `inProcessLaneBacklog` filled by
 * publishing through `countTransactional`. Both handlers insert one ledger
 * row in the work transaction and then wait PROVIDER_MS, as a provider call
 * would. Each round runs, in alternating order:
 * - with marketing: a marketing stream published at LANES_RATE jobs/s (default
 *   200, well below what the consumer can do) for WARMUP_MS + STEADY_MS, then
 *   a transactional burst of LANES_BURST jobs (default 5,000) published at
 *   once, the stream going on during the burst and after it;
 * - without: the same burst on a queue with no marketing consumer and no
 *   marketing stream.
 * Reports, the median over LANES_ROUNDS rounds (default 3):
 * - `lanes_marketing_before_per_s`: marketing completions per second in the
 *   steady part before the burst (the WARMUP_MS after the stream starts left out);
 * - `lanes_marketing_during_per_s`: marketing completions per second from the
 *   burst's first publish until the transactional backlog is empty (the last
 *   burst job's final outcome);
 * - `lanes_marketing_during_ratio`: during ÷ before, per round; goal ≤ 0.05;
 * - `lanes_marketing_recovery_ms`: from the backlog emptying to the first
 *   marketing completion t at which the completions of the 1-second window
 *   ending at t (counting none before the emptying) reach 90% of the round's
 *   before rate; goal ≤ 5,000 (-1: not within AFTER_MAX_MS);
 * - `lanes_marketing_after_per_s`: marketing completions per second in the
 *   AFTER_MIN_MS after the emptying (the yielded jobs catching up included);
 * - `lanes_burst_ms`: from the burst's first publish to the backlog emptying;
 * - `lanes_transactional_p99_ms_with_marketing` / `_without`: the p99 over the
 *   burst's jobs of publish → the delivery's end (the handler's commit and the
 *   removal from the backlog), and `lanes_transactional_p99_ratio` (with ÷
 *   without, of the medians); goal ≤ 1.2.
 * The p99 of a burst published at once is mostly its drain time, so the ratio
 * is close to the ratio of the burst times. Each run's line also prints this
 * process's CPU time during the burst, the yields in it, and the longest the
 * event loop was held: what the marketing lane costs the process.
 * It exits 1 when a published job has no ledger row or more than one, a row
 * belongs to no published job, a dead letter was written, or a backlog is not
 * empty at the end of its run: nothing lost or doubled.
 * The in-process queue starts a lane's next delivery in the microtask where
 * the last one settled, and a yield does no I/O, so yields run back to back
 * without giving the event loop back; past some marketing rate (1,000/s here)
 * a pass over the yielding jobs outlasts their yield wait and the loop never
 * comes back. A thread of its own kills the bench after LANES_DEADLINE_S
 * (default 240) rather than let it spin.
 * The last line printed is JSON.
 *
 *   pnpm --filter @softcrum/core bench:lanes     (LANES_ROUNDS=1 LANES_BURST=2000 for a short run)
 * Knobs for finding out why a goal is missed: LANES_CONCURRENCY (the queue's
 * deliveries in flight per subscription, default 8), LANES_POOL (Postgres
 * connections, default 2 × concurrency), LANES_REFRESH_MS (the backlog's
 * refreshMs, default the backlog's own), LANES_PROVIDER_MS (default 2).
 */
import { monitorEventLoopDelay } from "node:perf_hooks";
import { Worker } from "node:worker_threads";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { drizzle } from "drizzle-orm/postgres-js";
import { z } from "zod";
import { createMemoryQueue, type DeliveryEvent } from "../src/adapters/memory/index.ts";
import {
  bindConsumer,
  countTransactional,
  createEnvelope,
  defineConsumer,
  type Envelope,
  inProcessLaneBacklog,
  type LaneBacklog,
  type Logger,
  laneQueue,
} from "../src/index.ts";
import { benchDatabase } from "./bench-database.ts";

const env = (name: string, fallback: number) => {
  const value = process.env[name];
  return value === undefined || value === "" ? fallback : Number(value);
};
const RATE = env("LANES_RATE", 200);
const BURST = env("LANES_BURST", 5_000);
const ROUNDS = env("LANES_ROUNDS", 3);
const CONCURRENCY = env("LANES_CONCURRENCY", 8);
const POOL = env("LANES_POOL", 2 * CONCURRENCY);
const PROVIDER_MS = env("LANES_PROVIDER_MS", 2);
const REFRESH_MS = process.env["LANES_REFRESH_MS"] ? Number(process.env["LANES_REFRESH_MS"]) : undefined;
const WARMUP_MS = 500;
const STEADY_MS = 2_500;
const AFTER_MIN_MS = 2_000;
const AFTER_MAX_MS = 8_000;
const WINDOW_MS = 1_000;
/** A burst still unsettled this long after its first publish fails the bench. */
const BURST_DEADLINE_MS = 60_000;
/** The whole bench still running after this long is killed (LANES_DEADLINE_S). */
const DEADLINE_S = env("LANES_DEADLINE_S", 240);
const RECOVERED = 0.9;

const CHANNEL = "email";
const TRANSACTIONAL = laneQueue(CHANNEL, "transactional");
const MARKETING = laneQueue(CHANNEL, "marketing");
const MARKETING_ROW = 0;
const TRANSACTIONAL_ROW = 1;

const ledger = pgTable("bench_ledger", { jobId: uuid("job_id").notNull(), amount: integer("amount").notNull() });
const schema = z.object({ n: z.number().int() });

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
/** The q-quantile of `values` (nearest rank). */
const quantile = (values: readonly number[], q: number) =>
  [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.ceil(values.length * q) - 1)] ?? Number.NaN;
const median = (values: readonly number[]) => quantile(values, 0.5);
const round = (value: number, digits = 1) => Number(value.toFixed(digits));
/** Completions in [from, to). `stamps` ascending. */
const countIn = (stamps: readonly number[], from: number, to: number) =>
  stamps.filter((t) => t >= from && t < to).length;

const logged: string[] = [];
const logger: Logger = {
  warn: (message) => logged.push(`warn ${message}`),
  error: (message) => logged.push(`error ${message}`),
};

/** Every job published, by job_id: what the ledger must hold exactly once each. */
const published = new Set<string>();
const outcomes = new Map<string, number>();

const db = await benchDatabase("lanes", POOL);
// A process whose event loop never comes back (see the header) is killed from a thread of its own.
const watchdog = new Worker(
  `setTimeout(() => {
    require("node:fs").writeSync(2, ${JSON.stringify(`lanes: still running after ${DEADLINE_S} s, killed (its event loop may be held: see the lines above); database ${new URL(db.url).pathname.slice(1)} left behind\n`)});
    process.kill(process.pid, "SIGKILL");
  }, ${DEADLINE_S * 1000});`,
  { eval: true },
);
watchdog.unref();
const orm = drizzle({ client: db.sql });

function consumerOf(queue: string, name: string, row: number) {
  return defineConsumer({
    name,
    queue,
    kind: "notif.send.v1",
    schema,
    async handle(_data, { tx, envelope }) {
      await tx.insert(ledger).values({ jobId: envelope.job_id, amount: row });
      if (PROVIDER_MS > 0) await sleep(PROVIDER_MS);
    },
  });
}

function job(n: number): Envelope {
  const envelope = createEnvelope({ tenantId: "bench", kind: "notif.send.v1", data: { n } });
  published.add(envelope.job_id);
  return envelope;
}

interface Run {
  readonly p99Ms: number;
  readonly burstMs: number;
  /** CPU time this process spent (user + system) from the burst's first publish to the backlog emptying. */
  readonly burstCpuMs: number;
  /** The longest the event loop was held (a 10 ms timer's delay) in the same span. */
  readonly stallMaxMs: number;
  readonly marketing?: {
    readonly beforePerS: number;
    readonly duringPerS: number;
    readonly afterPerS: number;
    readonly recoveryMs: number;
  };
}

/**
 * One run on a queue and backlog of its own: the burst, with the marketing
 * stream around it or without any marketing.
 */
async function run(label: string, withMarketing: boolean, burst: number, steadyMs = STEADY_MS): Promise<Run> {
  const backlog: LaneBacklog = inProcessLaneBacklog(REFRESH_MS === undefined ? {} : { refreshMs: REFRESH_MS });
  const queue = createMemoryQueue({ concurrency: CONCURRENCY });
  const publisher = countTransactional(queue, backlog, { logger });
  const deps = { db: orm, logger, laneBacklog: backlog };
  const transactional = consumerOf(TRANSACTIONAL, `lanes.transactional.${label}`, TRANSACTIONAL_ROW);
  const marketing = consumerOf(MARKETING, `lanes.marketing.${label}`, MARKETING_ROW);

  const publishedAt = new Map<string, number>();
  const latencies: number[] = [];
  const marketingDone: number[] = [];
  let settled = 0;
  let yields = 0;
  let emptied: (at: number) => void = () => {};
  const empty = new Promise<number>((resolve) => {
    emptied = resolve;
  });
  queue.onDelivery((event: DeliveryEvent) => {
    const at = performance.now();
    const lane = event.queue === MARKETING ? "marketing" : "transactional";
    const key = `${lane} ${event.result.outcome}`;
    outcomes.set(key, (outcomes.get(key) ?? 0) + 1);
    if (event.result.outcome === "yielded") yields += 1;
    if (event.result.outcome === "thrown" || !event.result.ack) return;
    if (lane === "marketing") {
      if (event.result.outcome === "success") marketingDone.push(at);
      return;
    }
    const sent = publishedAt.get(event.messageId);
    if (sent !== undefined) latencies.push(at - sent);
    settled += 1;
    if (settled === burst) emptied(at);
  });
  queue.subscribe(bindConsumer(transactional, deps));
  if (withMarketing) queue.subscribe(bindConsumer(marketing, deps));

  // The marketing stream: each job at its own time on a fixed schedule (a late timer publishes all that are due).
  let streaming = withMarketing;
  let marketingJobs = 0;
  const streamStart = performance.now();
  const stream = (async () => {
    while (streaming) {
      const due = Math.floor(((performance.now() - streamStart) * RATE) / 1000) + 1;
      while (marketingJobs < due) {
        marketingJobs += 1;
        await publisher.publish(MARKETING, job(marketingJobs));
      }
      await sleep(Math.max(1, streamStart + (marketingJobs * 1000) / RATE - performance.now()));
    }
  })();

  try {
    if (withMarketing) await sleep(WARMUP_MS + steadyMs);
    const burstJobs = Array.from({ length: burst }, (_, n) => job(n));
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();
    const cpuBefore = process.cpuUsage();
    const yieldsBefore = yields;
    const burstAt = performance.now();
    for (const envelope of burstJobs) {
      const sent = performance.now();
      const receipt = await publisher.publish(TRANSACTIONAL, envelope);
      if (receipt.messageId === null) throw new Error(`${label}: the in-process queue gave no message id`);
      publishedAt.set(receipt.messageId, sent);
    }
    let deadline: NodeJS.Timeout | undefined;
    const emptyAt = await Promise.race([
      empty,
      new Promise<never>((_, reject) => {
        deadline = setTimeout(
          () => reject(new Error(`${label}: ${settled} of ${burst} burst jobs settled after ${BURST_DEADLINE_MS} ms`)),
          BURST_DEADLINE_MS,
        );
      }),
    ]).finally(() => clearTimeout(deadline));
    const cpu = process.cpuUsage(cpuBefore);
    loop.disable();
    const burstYields = yields - yieldsBefore;
    const left = await backlog.size(CHANNEL);
    if (left !== 0)
      throw new Error(`${label}: ${left} jobs still in the transactional backlog after the burst settled`);

    let marketingResult: Run["marketing"];
    if (withMarketing) {
      const steadyFrom = streamStart + WARMUP_MS;
      const beforePerS = countIn(marketingDone, steadyFrom, burstAt) / ((burstAt - steadyFrom) / 1000);
      const recoveryAt = (): number | undefined => {
        const needed = RECOVERED * beforePerS * (WINDOW_MS / 1000);
        let first = marketingDone.findIndex((t) => t >= emptyAt);
        if (first < 0) return undefined;
        for (let last = first; last < marketingDone.length; last++) {
          const at = marketingDone[last] as number;
          while ((marketingDone[first] as number) <= at - WINDOW_MS) first += 1;
          if (last - first + 1 >= needed) return at;
        }
        return undefined;
      };
      let recovered = recoveryAt();
      const since = () => performance.now() - emptyAt;
      while (since() < AFTER_MIN_MS || (recovered === undefined && since() < AFTER_MAX_MS)) {
        await sleep(50);
        recovered ??= recoveryAt();
      }
      marketingResult = {
        beforePerS,
        duringPerS: countIn(marketingDone, burstAt, emptyAt) / ((emptyAt - burstAt) / 1000),
        afterPerS: countIn(marketingDone, emptyAt, emptyAt + AFTER_MIN_MS) / (AFTER_MIN_MS / 1000),
        recoveryMs: recovered === undefined ? -1 : recovered - emptyAt,
      };
    }
    streaming = false;
    await stream;
    await queue.drain();
    if (marketingDone.length !== marketingJobs) {
      throw new Error(`${label}: ${marketingJobs} marketing jobs published, ${marketingDone.length} succeeded`);
    }
    if (latencies.length !== burst)
      throw new Error(`${label}: ${burst} burst jobs published, ${latencies.length} timed`);
    const result: Run = {
      p99Ms: quantile(latencies, 0.99),
      burstMs: emptyAt - burstAt,
      burstCpuMs: (cpu.user + cpu.system) / 1000,
      stallMaxMs: loop.max / 1e6,
      ...(marketingResult ? { marketing: marketingResult } : {}),
    };
    const m = result.marketing;
    console.log(
      `lanes ${label}: burst of ${burst} in ${result.burstMs.toFixed(0)} ms, transactional p50 ${quantile(latencies, 0.5).toFixed(0)} / p99 ${result.p99Ms.toFixed(0)} ms; this process's CPU meanwhile ${result.burstCpuMs.toFixed(0)} ms, ${burstYields} yields, event loop held up to ${result.stallMaxMs.toFixed(0)} ms (p99 ${(loop.percentile(99) / 1e6).toFixed(0)} ms)` +
        (m
          ? `; marketing ${m.beforePerS.toFixed(1)}/s before, ${m.duringPerS.toFixed(2)}/s during, ${m.afterPerS.toFixed(1)}/s after, recovered in ${m.recoveryMs.toFixed(0)} ms (${marketingJobs} jobs)`
          : ""),
    );
    return result;
  } finally {
    streaming = false;
    await stream.catch(() => {});
    await queue.close();
  }
}

let result: Record<string, number> | undefined;
let failure: string | undefined;
const keepAlive = setInterval(() => {}, 60_000);
const started = performance.now();
try {
  // Connections opened, code warm: a short burst both ways, measured by nothing.
  await run("warmup-with", true, 300, 300);
  await run("warmup-without", false, 300);
  const withRuns: Run[] = [];
  const withoutRuns: Run[] = [];
  for (let r = 1; r <= ROUNDS; r++) {
    // Alternating order, so neither side always runs on the machine the other left behind.
    const order = r % 2 === 1 ? [true, false] : [false, true];
    for (const withMarketing of order) {
      const outcome = await run(`r${r}-${withMarketing ? "with" : "without"}`, withMarketing, BURST);
      (withMarketing ? withRuns : withoutRuns).push(outcome);
    }
  }
  const marketingOf = (pick: (m: NonNullable<Run["marketing"]>) => number) =>
    median(withRuns.map((r) => (r.marketing ? pick(r.marketing) : Number.NaN)));
  const p99With = median(withRuns.map((r) => r.p99Ms));
  const p99Without = median(withoutRuns.map((r) => r.p99Ms));

  // Nothing lost or doubled: one ledger row per job published, no row of another, no dead letter.
  const rows = await db.sql<{ job_id: string; n: number }[]>`
    select job_id::text as job_id, count(*)::int as n from bench_ledger group by job_id`;
  const [letters] = await db.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
  const counted = new Map(rows.map((row) => [row.job_id, row.n]));
  const missing = [...published].filter((id) => !counted.has(id)).length;
  const doubled = rows.filter((row) => row.n > 1).length;
  const strangers = rows.filter((row) => !published.has(row.job_id)).length;
  const effects = rows.reduce((n, row) => n + row.n, 0);
  console.log(
    `lanes: ${published.size} jobs published, ${effects} ledger rows (${missing} missing, ${doubled} doubled, ${strangers} of no published job), ${letters?.n} dead letters; outcomes ${JSON.stringify(Object.fromEntries(outcomes))}; ${((performance.now() - started) / 1000).toFixed(1)} s`,
  );
  const perRound = (pick: (r: Run) => number) =>
    withRuns.map((r, i) => `${pick(r).toFixed(0)}/${pick(withoutRuns[i] as Run).toFixed(0)}`).join(", ");
  console.log(
    `lanes: per round, with/without marketing: p99 ${perRound((r) => r.p99Ms)} ms; burst ${perRound((r) => r.burstMs)} ms; this process's CPU during the burst ${perRound((r) => r.burstCpuMs)} ms; event loop held up to ${perRound((r) => r.stallMaxMs)} ms`,
  );
  if (missing > 0 || doubled > 0 || strangers > 0 || effects !== published.size || (letters?.n ?? 0) > 0) {
    failure = "lanes: a job was lost or doubled, or dead-lettered";
  }
  result = {
    lanes_rounds: ROUNDS,
    lanes_marketing_before_per_s: round(marketingOf((m) => m.beforePerS)),
    lanes_marketing_during_per_s: round(
      marketingOf((m) => m.duringPerS),
      2,
    ),
    lanes_marketing_during_ratio: round(
      marketingOf((m) => m.duringPerS / m.beforePerS),
      4,
    ),
    lanes_marketing_after_per_s: round(marketingOf((m) => m.afterPerS)),
    lanes_marketing_recovery_ms: Math.round(marketingOf((m) => m.recoveryMs)),
    lanes_burst_ms: Math.round(median(withRuns.map((r) => r.burstMs))),
    lanes_transactional_p99_ms_with_marketing: Math.round(p99With),
    lanes_transactional_p99_ms_without: Math.round(p99Without),
    lanes_transactional_p99_ratio: round(p99With / p99Without, 3),
    lanes_published: published.size,
    lanes_effects: effects,
  };
} catch (error) {
  failure = `lanes: ${error instanceof Error ? error.message : String(error)}`;
} finally {
  clearInterval(keepAlive);
  await db.drop();
  await watchdog.terminate();
}
for (const line of logged.slice(0, 10)) console.error(line);
if (failure !== undefined) {
  console.error(failure);
  process.exitCode = 1;
}
if (result) console.log(JSON.stringify(result));
