/**
 * Rate limits across processes (#20 goal): a provider limit of 10/s shared by
 * 3 worker processes (bench/limits-worker.ts). Each binds a real consumer with
 * `limits: [provider("mail", { rate: 10, per: "1s" })]` through the harness,
 * on a throwaway Postgres database, with `upstashRateLimiter` over the real
 * `@upstash/redis` client against the REST shim in front of the local Redis
 * (test/upstash-shim.ts, in a process of its own: bench/limits-shim.ts), fed
 * by the in-process queue with LIMITS_JOBS jobs each (default 400: far more
 * than the limit lets through, so the limit, not demand, is the bottleneck),
 * for LIMITS_SECONDS (default 20). Each handler calls a fake provider, an
 * HTTP server in this process on 127.0.0.1 that records when each call
 * arrives — what a real provider counts — then writes one ledger row in its
 * work transaction. Reports:
 * - `limits_max_in_any_second`: the most calls that arrived at the provider
 *   in any sliding window [t, t + 1 s) of the steady part (after the first
 *   2 s); goal ≤ 10;
 * - `limits_max_in_any_second_whole_run`: the same over every call, the
 *   processes' cold start included (no goal of its own: see below);
 * - `limits_achieved_per_s`: calls arrived in the steady part / its length;
 *   goal ≥ 9 (tokens 105 ms apart with the limiter's default 5% headroom: at
 *   most 9.52/s);
 * - `limits_processes` (3), `limits_rate` (10), `limits_calls` (every call the
 *   provider answered) and `limits_effects` (ledger rows in Postgres).
 * It exits 1 when the effects differ from the calls the provider answered,
 * or a job reached the provider twice: nothing lost or doubled. It also
 * prints the most tokens in one sliding second at their decisions, the
 * latency from a token's decision to its call's arrival (in parts: the take's
 * answer, the transaction opened and fenced, the HTTP call), and the calls of
 * the densest second when it holds more than 10. LIMITS_HEADROOM sets the
 * limiter's headroom (default its own, 0.05). The last line printed is JSON.
 *
 * What the provider can see. The limiter spaces tokens at least 105 ms apart
 * at their decisions (each caller's Date.now(), read as its take goes out):
 * never more than 10 in a sliding second there, in every run. But 11 calls
 * can reach the provider within one second when the first of 11 consecutive
 * tokens took more than 50 ms longer from decision to arrival than the last.
 * Measured on the 2-core development machine: that latency is ~5–30 ms at its
 * median, but the first call of a cold worker takes 150–250 ms (JIT, first
 * connections, prepared statements), and under load from other processes
 * (load average 5–8) its tail reaches 100–600 ms. Then the provider sees 11,
 * sometimes 12. The number is not hidden: the key is what arrived. A headroom
 * of 0.1 did not help under that load (11–12 at the provider, 8.5/s achieved,
 * below the rate goal): spacing cannot absorb hundreds of ms of CPU
 * starvation without giving up the rate. What a real provider counts is its
 * own window or bucket at its edge, behind internet latency the fleet does
 * not control, so no client-side spacing can promise a sliding window there
 * beyond its headroom; the guarantee the limiter keeps is at its decisions,
 * and a provider that counted one call too many answers 429, which blocks the
 * bucket for every process and defers the job without spending an attempt.
 *
 *   pnpm --filter @softcrum/core bench:limits          (LIMITS_SECONDS=5 for a short run)
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { DEFAULT_UPSTASH_LIMITS_HEADROOM, upstashIntervalMs } from "../src/limits/upstash.ts";
import { benchDatabase } from "./bench-database.ts";

const PROCESSES = 3;
const RATE = 10;
const SECONDS = Number(process.env["LIMITS_SECONDS"] ?? 20);
const JOBS = Number(process.env["LIMITS_JOBS"] ?? 400);
const CONCURRENCY = 4;
const WARMUP_MS = 2_000;
const WINDOW_MS = 1_000;
const HEADROOM = Number(process.env["LIMITS_HEADROOM"] || DEFAULT_UPSTASH_LIMITS_HEADROOM);

/** The most stamps in any half-open window [t, t + windowMs). */
function mostInAnyWindow(stamps: readonly number[], windowMs: number): number {
  const sorted = [...stamps].sort((a, b) => a - b);
  let most = 0;
  let first = 0;
  for (const [last, stamp] of sorted.entries()) {
    while (stamp - (sorted[first] as number) >= windowMs) first += 1;
    most = Math.max(most, last - first + 1);
  }
  return most;
}

/** The calls of the first window [t, t + windowMs) holding the most arrivals. */
function densestWindow(all: readonly Call[], windowMs: number): Call[] {
  const sorted = [...all].sort((a, b) => a.at - b.at);
  let best: [number, number] = [0, 0];
  let first = 0;
  for (const [last, call] of sorted.entries()) {
    while (call.at - (sorted[first] as Call).at >= windowMs) first += 1;
    if (last - first + 1 > best[1] - best[0]) best = [first, last + 1];
  }
  return sorted.slice(...best);
}

/** The q-quantile of `values` (nearest rank). */
const quantile = (values: readonly number[], q: number) =>
  [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(values.length * q))] ?? Number.NaN;

/** Epoch ms with sub-ms precision, one clock with the workers' Date.now(). */
const nowMs = () => performance.timeOrigin + performance.now();

interface Call {
  /** When it arrived at the provider. */
  readonly at: number;
  /** When its token was decided (the worker's Date.now() at its take). */
  readonly granted: number;
  /** When the worker had the take's answer (its Date.now()). */
  readonly answered: number;
  /** When the handler started, the transaction open and fenced (the worker's Date.now()). */
  readonly handler: number;
  readonly job: string;
  readonly worker: string;
}
interface WorkerReport {
  readonly outcomes: Record<string, number>;
  readonly grants: number[];
  readonly errors: string[];
}

// The fake provider: answers every call 200, recording its arrival.
const calls: Call[] = [];
const providerServer = createServer((req, res) => {
  const at = nowMs();
  const url = new URL(req.url ?? "/", "http://provider");
  req.resume();
  req.on("end", () => {
    calls.push({
      at,
      granted: Number(url.searchParams.get("granted") ?? Number.NaN),
      answered: Number(url.searchParams.get("answered") ?? Number.NaN),
      handler: Number(url.searchParams.get("handler") ?? Number.NaN),
      job: url.searchParams.get("job") ?? "",
      worker: url.searchParams.get("worker") ?? "",
    });
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ id: calls.length }));
  });
});
await new Promise<void>((resolve) => providerServer.listen(0, "127.0.0.1", resolve));
const providerUrl = `http://127.0.0.1:${(providerServer.address() as AddressInfo).port}`;

const children: ChildProcess[] = [];
/** A `node --import tsx` child from packages/core, its stdin a pipe, its stderr passed through. */
function spawnChild(file: string, args: readonly string[]): ChildProcess {
  const script = fileURLToPath(new URL(`./${file}`, import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script, ...args], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    stdio: ["pipe", "pipe", "inherit"],
  });
  children.push(child);
  return child;
}
/** The first whole line of the child's stdout starting with `prefix`, without it; rejects if the child exits first. */
function lineOf(child: ChildProcess, prefix: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = "";
    child.stdout?.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      const line = output
        .split("\n")
        .slice(0, -1)
        .find((l) => l.startsWith(prefix));
      if (line !== undefined) resolve(line.slice(prefix.length));
    });
    child.on("exit", (code) => reject(new Error(`bench/${child.spawnargs[3]} exited (${code}): ${output}`)));
  });
}

const bench = await benchDatabase("limits", 2);
const prefix = `softcrum-bench:limits:${randomUUID()}`;
const shimProcess = spawnChild("limits-shim.ts", [prefix]);
let result: Record<string, number> | undefined;
let failure: string | undefined;
try {
  const [shimUrl = "", shimToken = ""] = (await lineOf(shimProcess, "SHIM ")).split(" ");
  const workers = Array.from({ length: PROCESSES }, (_, n) => {
    const child = spawnChild("limits-worker.ts", [
      bench.url,
      shimUrl,
      shimToken,
      prefix,
      providerUrl,
      String(n + 1),
      String(JOBS),
      String(CONCURRENCY),
    ]);
    const done = lineOf(child, "DONE ").then((line) => JSON.parse(line) as WorkerReport);
    done.catch(() => {}); // awaited below; a worker dying before READY rejects that first
    return { child, ready: lineOf(child, "READY"), done };
  });
  await Promise.all(workers.map((w) => w.ready));
  const startAt = Date.now() + 200;
  const endAt = startAt + SECONDS * 1_000;
  for (const { child } of workers) child.stdin?.end(`START ${startAt} ${endAt}\n`);
  const reports = await Promise.all(workers.map((w) => w.done));

  const [row] = await bench.sql<{ effects: number; jobs: number }[]>`
    select count(*)::int as effects, count(distinct job_id)::int as jobs from bench_ledger`;
  const effects = row?.effects ?? -1;
  const effectJobs = row?.jobs ?? -1;
  const calledJobs = new Set(calls.map((call) => call.job)).size;
  const successes = reports.reduce((n, r) => n + (r.outcomes["success"] ?? 0), 0);
  const problems = [
    effects !== calls.length ? `${effects} effects in Postgres for ${calls.length} provider calls answered` : "",
    effectJobs !== effects ? `${effects - effectJobs} jobs with more than one effect` : "",
    calledJobs !== calls.length ? `${calls.length - calledJobs} jobs called the provider more than once` : "",
    successes !== effects ? `${successes} successful deliveries for ${effects} effects` : "",
  ].filter(Boolean);
  if (problems.length > 0) failure = problems.join("; ");

  const steadyFrom = startAt + WARMUP_MS;
  const steady = calls.filter((call) => call.at >= steadyFrom && call.at < endAt).map((call) => call.at);
  const grants = reports.flatMap((r) => r.grants);
  const steadyGrants = grants.filter((at) => at >= steadyFrom && at < endAt);
  const maxSteady = mostInAnyWindow(steady, WINDOW_MS);
  const maxWholeRun = mostInAnyWindow(
    calls.map((call) => call.at),
    WINDOW_MS,
  );
  // What a provider counting calendar seconds (a fixed window) would see.
  const perCalendarSecond = new Map<number, number>();
  for (const call of calls) {
    const second = Math.floor(call.at / 1_000);
    perCalendarSecond.set(second, (perCalendarSecond.get(second) ?? 0) + 1);
  }
  const errors = reports.flatMap((r) => r.errors);
  const outcome = (name: string) => reports.reduce((n, r) => n + (r.outcomes[name] ?? 0), 0);
  console.log(
    `limits: ${PROCESSES} processes × ${JOBS} jobs, provider limit ${RATE}/s (a token every ${upstashIntervalMs({ rate: RATE, perMs: 1_000 }, HEADROOM)} ms: headroom ${HEADROOM}), ` +
      `${SECONDS} s (steady after ${WARMUP_MS / 1000} s); ` +
      `${calls.length} provider calls (${reports.map((r) => r.outcomes["success"] ?? 0).join(" + ")}), ${effects} effects; ` +
      `most in one sliding second at the provider ${maxSteady} steady, ${maxWholeRun} whole run ` +
      `(${Math.max(...perCalendarSecond.values())} in one calendar second); ` +
      `at the token decisions ${mostInAnyWindow(steadyGrants, WINDOW_MS)} steady, ${mostInAnyWindow(grants, WINDOW_MS)} whole run; ` +
      `${outcome("rate_limited")} deliveries rate_limited, ${outcome("deferred")} deferred${
        errors.length > 0 ? `; first errors: ${errors.slice(0, 3).join(" | ")}` : ""
      }`,
  );
  // From a token's decision to its call's arrival at the provider, in three
  // parts: the take's answer, the work transaction opened and fenced (the
  // handler's start), the HTTP call.
  const spans = (span: (call: Call) => number) => {
    const values = calls.map(span);
    return `p50 ${quantile(values, 0.5).toFixed(0)}, p99 ${quantile(values, 0.99).toFixed(0)}, max ${Math.max(...values).toFixed(0)} ms`;
  };
  console.log(
    `limits: decision → provider arrival ${spans((c) => c.at - c.granted)}; ` +
      `the take's answer ${spans((c) => c.answered - c.granted)}; the transaction opened ${spans((c) => c.handler - c.answered)}; ` +
      `the HTTP call ${spans((c) => c.at - c.handler)}`,
  );
  const densest = densestWindow(calls, WINDOW_MS);
  if (densest.length > RATE) {
    const t0 = (densest[0] as Call).at;
    console.log(
      `limits: ${densest.length} calls arrived within ${((densest.at(-1) as Call).at - t0).toFixed(1)} ms, from ${(t0 - startAt).toFixed(0)} ms into the run ` +
        `(worker: decision → handler → arrival, ms from the first arrival): ${densest
          .map(
            (c) =>
              `${c.worker}: ${(c.granted - t0).toFixed(0)} → ${(c.handler - t0).toFixed(0)} → ${(c.at - t0).toFixed(1)}`,
          )
          .join(", ")}`,
    );
  }
  result = {
    limits_processes: PROCESSES,
    limits_rate: RATE,
    limits_max_in_any_second: maxSteady,
    limits_max_in_any_second_whole_run: maxWholeRun,
    limits_achieved_per_s: Number((steady.length / ((endAt - steadyFrom) / 1_000)).toFixed(2)),
    limits_calls: calls.length,
    limits_effects: effects,
  };
} finally {
  // The workers are done (or failed: then killed); the shim deletes the run's keys when its stdin ends.
  for (const child of children) if (child !== shimProcess && child.exitCode === null) child.kill("SIGKILL");
  const shimExited = new Promise((resolve) => shimProcess.once("exit", resolve));
  shimProcess.stdin?.end();
  await Promise.race([shimExited, new Promise((resolve) => setTimeout(resolve, 5_000).unref())]);
  if (shimProcess.exitCode === null) shimProcess.kill("SIGKILL");
  providerServer.closeAllConnections();
  await new Promise<void>((resolve) => providerServer.close(() => resolve()));
  await bench.drop();
}
if (failure) {
  console.error(`limits: exactly-once check failed: ${failure}`);
  process.exitCode = 1;
}
console.log(JSON.stringify(result));
