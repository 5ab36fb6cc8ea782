/**
 * Smoke run of `pnpm bench:peers` for CI: every system once on 500 jobs, as a
 * person would run it (its own process), and its last line checked: exactly
 * the documented keys, a positive rate for every system, and pgbench's rate
 * null only where pgbench is absent.
 */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { findPgbench, SYSTEMS } from "../src/config.ts";

const KEYS = [
  "harness_jobs_per_s",
  "harness_batched_jobs_per_s",
  "graphile_worker_jobs_per_s",
  "pg_boss_jobs_per_s",
  "dbos_jobs_per_s",
  "pgbench_tps",
  "vs_best_peer",
  "batched_vs_best_peer",
  "batched_vs_pgbench",
  "cpu_us_per_job",
  "write_txns_per_job",
  "wal_bytes_per_job",
];

function runBench(env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const script = fileURLToPath(new URL("../src/peers.bench.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
  });
  child.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** A run of 500 jobs, one round, with `env`: it must exit 0; its printout and its last line, parsed. */
async function smokeRun(env: NodeJS.ProcessEnv): Promise<{ stdout: string; result: Record<string, unknown> }> {
  const run = await runBench({ PEERS_N: "500", PEERS_ROUNDS: "1", ...env });
  // The failure's own words are at the end of what the run printed.
  expect(run.code, `exit ${run.code}:\n${run.stderr.slice(-3000)}`).toBe(0);
  return { stdout: run.stdout, result: JSON.parse(run.stdout.trim().split("\n").at(-1) ?? "") };
}

/** A run with a bad `env`: it must fail before any work, naming the accepted values; its stderr. */
async function refusedRun(env: NodeJS.ProcessEnv): Promise<string> {
  const run = await runBench({ PEERS_N: "500", PEERS_ROUNDS: "1", ...env });
  expect(run.code).not.toBe(0);
  return run.stderr;
}

const positive = (value: unknown) => typeof value === "number" && Number.isFinite(value) && value > 0;

describe("pnpm bench:peers", () => {
  it("runs every system on 500 jobs and ends with the documented JSON line", async () => {
    const { result } = await smokeRun({ PEERS_SYSTEMS: "" });
    expect(Object.keys(result).sort()).toEqual([...KEYS].sort());

    const pgbench = findPgbench() !== undefined;
    for (const key of KEYS.filter((k) => k.endsWith("_jobs_per_s"))) expect(positive(result[key]), key).toBe(true);
    expect(pgbench ? positive(result["pgbench_tps"]) : result["pgbench_tps"] === null, "pgbench_tps").toBe(true);
    expect(positive(result["vs_best_peer"]), "vs_best_peer").toBe(true);
    expect(positive(result["batched_vs_best_peer"]), "batched_vs_best_peer").toBe(true);
    expect(pgbench ? positive(result["batched_vs_pgbench"]) : result["batched_vs_pgbench"] === null).toBe(true);

    const ran = SYSTEMS.filter((system) => system !== "pgbench" || pgbench);
    for (const key of ["cpu_us_per_job", "write_txns_per_job", "wal_bytes_per_job"]) {
      const perSystem = result[key] as Record<string, unknown>;
      expect(Object.keys(perSystem).sort(), key).toEqual([...ran].sort());
      for (const system of ran) expect(positive(perSystem[system]), `${key}.${system}`).toBe(true);
    }
  });
});

describe("raw_postgresjs", () => {
  it("runs only when named: its effects exactly once, in the per-system measures and the notes, never a peer", async () => {
    const { stdout, result } = await smokeRun({ PEERS_SYSTEMS: "harness,raw_postgresjs" });
    expect(Object.keys(result).sort()).toEqual([...KEYS].sort());
    for (const key of ["cpu_us_per_job", "write_txns_per_job", "wal_bytes_per_job"]) {
      const perSystem = result[key] as Record<string, unknown>;
      expect(Object.keys(perSystem).sort(), key).toEqual(["harness", "raw_postgresjs"]);
      expect(positive(perSystem["raw_postgresjs"]), `${key}.raw_postgresjs`).toBe(true);
    }
    // One commit per job, as the harness's single job.
    expect((result["write_txns_per_job"] as Record<string, number>)["raw_postgresjs"]).toBeGreaterThanOrEqual(1);
    // Not a peer: with no peer run, there is no best peer.
    expect(result["vs_best_peer"]).toBeNull();
    expect(stdout).toMatch(/harness \/ raw_postgresjs: \d/);
  });

  it("an unknown name is refused with every known one", async () => {
    expect(await refusedRun({ PEERS_SYSTEMS: "harness,raw" })).toContain(
      "PEERS_SYSTEMS: unknown raw; known: harness, harness_batched, graphile_worker, pg_boss, dbos, pgbench, raw_postgresjs",
    );
  });
});

describe("PEERS_HANDLER", () => {
  it("builder: the harness systems run with Drizzle's builder in the handler, each effect exactly once", async () => {
    const { stdout, result } = await smokeRun({ PEERS_SYSTEMS: "harness,harness_batched", PEERS_HANDLER: "builder" });
    expect(stdout).toContain("harness handler builder");
    expect(positive(result["harness_jobs_per_s"]) && positive(result["harness_batched_jobs_per_s"])).toBe(true);
  });

  it("anything else is refused with the accepted values, before any database is made", async () => {
    expect(await refusedRun({ PEERS_HANDLER: "raw" })).toContain("PEERS_HANDLER: raw is not one of prepared, builder");
  });
});

describe("PEERS_BATCH", () => {
  it("sequential: harness_batched runs a savepoint per job, each effect exactly once, one transaction id per job", async () => {
    const { stdout, result } = await smokeRun({ PEERS_SYSTEMS: "harness_batched", PEERS_BATCH: "sequential" });
    expect(stdout).toContain("batch sequential");
    expect(positive(result["harness_batched_jobs_per_s"])).toBe(true);
    // A savepoint that writes takes a transaction id of its own: at least one per job.
    const txns = (result["write_txns_per_job"] as Record<string, number>)["harness_batched"] ?? 0;
    expect(txns).toBeGreaterThanOrEqual(1);
  });

  it("anything else is refused with the accepted values", async () => {
    expect(await refusedRun({ PEERS_BATCH: "parallel" })).toContain(
      "PEERS_BATCH: parallel is not one of concurrent, sequential",
    );
  });
});

describe("PEERS_BATCH_SIZE", () => {
  it("caps harness_batched's batches (by default the concurrency): batches of at most 4 take at least one transaction id per 4 jobs", async () => {
    const { stdout, result } = await smokeRun({ PEERS_SYSTEMS: "harness_batched", PEERS_BATCH_SIZE: "4" });
    expect(stdout).toContain("batch concurrent of up to 4");
    const txns = (result["write_txns_per_job"] as Record<string, number>)["harness_batched"] ?? 0;
    expect(txns).toBeGreaterThanOrEqual(0.25);
  });

  it("past batch.maxSize's limit, or not a whole number, is refused before any database is made", async () => {
    expect(await refusedRun({ PEERS_BATCH_SIZE: "65" })).toContain(
      "PEERS_BATCH_SIZE must be at most 64 (batch.maxSize's limit), got 65",
    );
    expect(await refusedRun({ PEERS_BATCH_SIZE: "0" })).toContain("PEERS_BATCH_SIZE must be a whole number ≥ 1, got 0");
  });
});
