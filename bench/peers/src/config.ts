/**
 * What `pnpm bench:peers` runs, from the environment: the systems, how many
 * jobs, rounds and workers. Shared by the orchestrator (peers.bench.ts) and
 * the process each system runs in (run-system.ts).
 */
import { execFileSync } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { delimiter, join } from "node:path";

/** The systems of a default run, in the order of the table and of the first round. */
export const SYSTEMS = ["harness", "harness_batched", "graphile_worker", "pg_boss", "dbos", "pgbench"] as const;
/**
 * References that run only when PEERS_SYSTEMS names them (the default run,
 * and its JSON line, stay the six systems): `raw_postgresjs`, the
 * harness's single-job transaction by hand on postgres.js.
 */
export const REFERENCES = ["raw_postgresjs"] as const;
/** Every system that can run, in the order of the table. */
export const ALL_SYSTEMS = [...SYSTEMS, ...REFERENCES] as const;
export type SystemName = (typeof ALL_SYSTEMS)[number];

/** The job systems the harness is compared with; the fastest of them is the "best peer". */
export const PEERS: readonly SystemName[] = ["graphile_worker", "pg_boss", "dbos"];

/** Jobs run, untimed, before each timed run (connections, prepared statements, the JIT). */
export const WARMUP_JOBS = 500;

/** The most jobs a batch of @softcrum/core may hold (`batch.maxSize`, checked by `defineConsumer`). */
const MAX_BATCH_SIZE = 64;

/** What one system's process is told to do. */
export interface RunSpec {
  readonly system: SystemName;
  /** Jobs in the timed run. */
  readonly jobs: number;
  readonly warmup: number;
  /** Concurrent workers (harness loops, graphile-worker jobs, DBOS worker concurrency, pgbench clients). */
  readonly concurrency: number;
  /** 1-based; part of the database names. */
  readonly round: number;
  /** The maintenance database URL of the server (a user that may CREATE DATABASE). */
  readonly adminUrl: string;
  /** The pgbench binary (only for `pgbench`). */
  readonly pgbench?: string;
  /** How the harness's handler writes the effect (only for `harness`, `harness_batched`). */
  readonly handler?: HarnessHandler;
  /** How `harness_batched` runs a batch's handlers (only for `harness_batched`). */
  readonly batch?: HarnessBatch;
  /** `harness_batched`'s `batch.maxSize` (only for `harness_batched`). */
  readonly batchSize?: number;
}

/**
 * `concurrent`: `batch.concurrent`, the handlers pipelined at once with no
 * savepoints (the form the benchmark's one-insert handler may use);
 * `sequential`: a savepoint per job, one handler after another.
 */
export const HARNESS_BATCHES = ["concurrent", "sequential"] as const;
export type HarnessBatch = (typeof HARNESS_BATCHES)[number];

/**
 * `prepared`: the insert built once by `preparedQuery` (the README's form for
 * a hot query); `builder`: `tx.insert(effects).values(…)`, built by Drizzle
 * on every job.
 */
export const HARNESS_HANDLERS = ["prepared", "builder"] as const;
export type HarnessHandler = (typeof HARNESS_HANDLERS)[number];

/** What one system's process reports: its last stdout line, as JSON. */
export interface Sample {
  readonly system: SystemName;
  readonly jobs: number;
  /** The timed run: from starting the workers to the last effect committed. */
  readonly seconds: number;
  readonly jobsPerS: number;
  /** Client CPU (user + system) over the measured window, µs per job. */
  readonly cpuUsPerJob: number | null;
  /** Transaction ids assigned cluster-wide over the measured window, per job. */
  readonly writeTxnsPerJob: number;
  /** WAL written cluster-wide over the measured window, bytes per job. */
  readonly walBytesPerJob: number;
}

export interface BenchOptions {
  readonly jobs: number;
  readonly rounds: number;
  readonly concurrency: number;
  readonly systems: readonly SystemName[];
  readonly handler: HarnessHandler;
  readonly batch: HarnessBatch;
  readonly batchSize: number;
}

function positiveInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a whole number ≥ 1, got ${raw}`);
  return value;
}

/**
 * PEERS_N (20000), PEERS_ROUNDS (3), PEERS_CONCURRENCY (16), PEERS_SYSTEMS
 * (SYSTEMS, comma list, may name REFERENCES), PEERS_HANDLER (prepared),
 * PEERS_BATCH (concurrent), PEERS_BATCH_SIZE (the concurrency, at most
 * the core's MAX_BATCH_SIZE).
 */
export function benchOptions(): BenchOptions {
  const listed = (process.env["PEERS_SYSTEMS"] ?? "")
    .split(",")
    .map((name) => name.trim())
    .filter((name) => name !== "");
  const unknown = listed.filter((name) => !(ALL_SYSTEMS as readonly string[]).includes(name));
  if (unknown.length > 0) {
    throw new Error(`PEERS_SYSTEMS: unknown ${unknown.join(", ")}; known: ${ALL_SYSTEMS.join(", ")}`);
  }
  const handler = process.env["PEERS_HANDLER"] || "prepared";
  if (!(HARNESS_HANDLERS as readonly string[]).includes(handler)) {
    throw new Error(`PEERS_HANDLER: ${handler} is not one of ${HARNESS_HANDLERS.join(", ")}`);
  }
  const batch = process.env["PEERS_BATCH"] || "concurrent";
  if (!(HARNESS_BATCHES as readonly string[]).includes(batch)) {
    throw new Error(`PEERS_BATCH: ${batch} is not one of ${HARNESS_BATCHES.join(", ")}`);
  }
  const concurrency = positiveInt("PEERS_CONCURRENCY", 16);
  // Every delivery in flight can share one transaction: with 16 loops, one
  // batch of 16 (0.0625 transactions per job) beat two of 8 in interleaved
  // runs (about 9 % more jobs/s, 20 % less client CPU per job).
  const batchSize = positiveInt("PEERS_BATCH_SIZE", Math.min(concurrency, MAX_BATCH_SIZE));
  if (batchSize > MAX_BATCH_SIZE) {
    throw new Error(`PEERS_BATCH_SIZE must be at most ${MAX_BATCH_SIZE} (batch.maxSize's limit), got ${batchSize}`);
  }
  return {
    handler: handler as HarnessHandler,
    batch: batch as HarnessBatch,
    batchSize,
    jobs: positiveInt("PEERS_N", 20_000),
    rounds: positiveInt("PEERS_ROUNDS", 3),
    concurrency,
    systems: listed.length === 0 ? SYSTEMS : ALL_SYSTEMS.filter((name) => listed.includes(name)),
  };
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** pgbench on PATH, else in `pg_config --bindir`; undefined when neither has it. */
export function findPgbench(): string | undefined {
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    if (dir && executable(join(dir, "pgbench"))) return join(dir, "pgbench");
  }
  try {
    const bindir = execFileSync("pg_config", ["--bindir"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    const candidate = join(bindir.trim(), "pgbench");
    return executable(candidate) ? candidate : undefined;
  } catch {
    return undefined;
  }
}
