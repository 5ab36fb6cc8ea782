/**
 * One system, one round, in a process of its own (started by peers.bench.ts):
 * `node --import tsx src/run-system.ts '<RunSpec as JSON>'`. Its last stdout
 * line is its Sample as JSON; anything else it prints is the system's own
 * output. A process per run, so that no system's pools, timers or garbage
 * bill CPU to the next one, and DBOS's process-wide runtime starts clean.
 */
import type { RunSpec, Sample, SystemName } from "./config.ts";

type Runner = (spec: RunSpec) => Promise<Sample>;

/** Loaded on demand: a run imports its own system's SDK only. */
const RUNNERS: Record<SystemName, () => Promise<Runner>> = {
  harness: async () => (await import("./harness.ts")).runHarness,
  harness_batched: async () => (await import("./harness.ts")).runHarness,
  graphile_worker: async () => (await import("./graphile-worker.ts")).runGraphileWorker,
  pg_boss: async () => (await import("./pg-boss.ts")).runPgBoss,
  dbos: async () => (await import("./dbos.ts")).runDbos,
  pgbench: async () => (await import("./pgbench.ts")).runPgbench,
  raw_postgresjs: async () => (await import("./raw-postgresjs.ts")).runRawPostgresJs,
};

const spec = JSON.parse(process.argv[2] ?? "null") as RunSpec | null;
if (!spec || !(spec.system in RUNNERS)) {
  console.error("usage: run-system.ts '<RunSpec JSON>' (started by peers.bench.ts)");
  process.exit(2);
}
try {
  const run = await RUNNERS[spec.system]();
  const sample = await run(spec);
  // Some SDKs leave timers behind after their stop(): once the sample is out, leave.
  process.stdout.write(`\n${JSON.stringify(sample)}\n`, () => process.exit(0));
} catch (error) {
  console.error(`${spec.system} round ${spec.round} failed:`, error);
  process.exit(1);
}
