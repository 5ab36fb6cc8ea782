/**
 * `pnpm bench:peers`: the harness against graphile-worker, pg-boss and DBOS
 * (and pgbench as the ceiling) on the same work — each job inserts one row
 * into `effects` — on the same Postgres (ADR 0013, README.md here).
 *
 * PEERS_ROUNDS rounds; in each, every system of PEERS_SYSTEMS runs once, in
 * an order rotated each round, in a process of its own (run-system.ts), on
 * fresh databases it creates and drops: PEERS_N jobs queued before the clock,
 * a warm-up of 500 off the clock, then the timed run. The medians across
 * rounds make the table; the last line printed is one JSON object.
 * Progress goes to stderr; stdout carries the table and the JSON only.
 */
import { spawn } from "node:child_process";
import { availableParallelism, loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { findPostgres } from "@softcrum/testing/postgres";
import { benchOptions, findPgbench, type RunSpec, type Sample, type SystemName, WARMUP_JOBS } from "./config.ts";
import { notes, result, summarize, table } from "./report.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const RUN_SYSTEM = fileURLToPath(new URL("./run-system.ts", import.meta.url));

/** Runs one system for one round in its own process; its last stdout line is the Sample. */
async function runSystem(spec: RunSpec): Promise<Sample> {
  const child = spawn(process.execPath, ["--import", "tsx", RUN_SYSTEM, JSON.stringify(spec)], {
    cwd: PACKAGE_DIR,
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.on("data", (chunk: Buffer) => {
    out += chunk.toString();
  });
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", resolve);
  });
  const lines = out.trim().split("\n");
  const last = lines.pop() ?? "";
  // What the system printed itself (an SDK's banner or warnings): passed on, off stdout.
  for (const line of lines) if (line.trim() !== "") process.stderr.write(`  [${spec.system}] ${line}\n`);
  if (code !== 0 || !last.startsWith("{")) {
    throw new Error(`${spec.system} (round ${spec.round}) failed: exit ${code}${last ? `, last line: ${last}` : ""}`);
  }
  return JSON.parse(last) as Sample;
}

const options = benchOptions();
const pgbench = options.systems.includes("pgbench") ? findPgbench() : undefined;
const systems = options.systems.filter((system) => system !== "pgbench" || pgbench !== undefined);
if (options.systems.includes("pgbench") && !pgbench) {
  process.stderr.write("pgbench not found on PATH nor in `pg_config --bindir`: pgbench_tps will be null\n");
}

const server = await findPostgres();
try {
  const samples: Sample[] = [];
  const started = performance.now();
  for (let round = 1; round <= options.rounds; round++) {
    // Rotated each round, so that no system always runs first (or last).
    const order = systems.map((_, i) => systems[(i + round - 1) % systems.length] as SystemName);
    for (const system of order) {
      const spec: RunSpec = {
        system,
        jobs: options.jobs,
        warmup: WARMUP_JOBS,
        concurrency: options.concurrency,
        round,
        adminUrl: server.adminUrl,
        ...(system === "pgbench" && pgbench ? { pgbench } : {}),
        ...(system.startsWith("harness") ? { handler: options.handler } : {}),
        ...(system === "harness_batched" ? { batch: options.batch, batchSize: options.batchSize } : {}),
      };
      const sample = await runSystem(spec);
      samples.push(sample);
      process.stderr.write(
        `round ${round}/${options.rounds} ${system}: ${Math.round(sample.jobsPerS)} jobs/s (${sample.seconds.toFixed(2)} s)\n`,
      );
    }
  }
  const summaries = summarize(samples);
  const [one, five, fifteen] = loadavg().map((load) => load.toFixed(2));
  console.log(
    `\n${options.jobs} jobs per system and round (+${WARMUP_JOBS} warm-up), ${options.rounds} rounds (medians), ` +
      `concurrency ${options.concurrency}, harness handler ${options.handler}, batch ${options.batch} of up to ${options.batchSize}, Postgres from ${server.source}; ` +
      `${Math.round((performance.now() - started) / 1000)} s; load average ${one} ${five} ${fifteen} on ${availableParallelism()} CPUs`,
  );
  console.log(
    "write txns and WAL are cluster-wide (anything else running on the server counts); CPU is the client's (pgbench's own for pgbench)\n",
  );
  console.log(table(summaries));
  for (const line of notes(summaries)) console.log(line);
  console.log(JSON.stringify(result(summaries)));
} finally {
  await server.stop();
}
