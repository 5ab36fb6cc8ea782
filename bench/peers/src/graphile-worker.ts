/**
 * `graphile_worker` (0.17.3), tuned as its performance guide says for many
 * short jobs: `concurrentJobs` = spec.concurrency (16), `maxPoolSize` 18,
 * `useNodeTime`, a local queue of 500 (the pool locks 500 jobs per fetch and
 * hands them out without a round trip), and completions/failures batched
 * with no added delay (`completeJobBatchDelay: 0`, `failJobBatchDelay: 0`).
 * The task inserts the effect on the worker's pool (its own autocommit
 * transaction); the job row is deleted by the batched completion afterwards:
 * at-least-once.
 *
 * Jobs are added before the clock with `addJobs` (batches of 1,000); the
 * clock runs from `run()` (pool, migrations check, first fetch) to the last
 * effect; the meter stops once the jobs table is empty.
 */
import { randomUUID } from "node:crypto";
import { type AddJobsJobSpec, Logger, makeWorkerUtils, type Runner, run, type Task } from "graphile-worker";
import pg from "pg";
import type { RunSpec, Sample } from "./config.ts";
import {
  expectEffects,
  type JobData,
  Progress,
  pollUntil,
  sampleOf,
  startMeter,
  timeoutFor,
  withFreshDatabases,
} from "./measure.ts";

const TASK = "peers_credit";
const ADD_BATCH = 1000;

/** Errors and warnings only: the info lines of every start and stop would bury the table. */
const quietLogger = new Logger(() => (level, message) => {
  const name = String(level);
  if (name === "error" || name === "warning") console.error(`graphile-worker ${name}: ${message}`);
});

function jobSpecs(count: number): AddJobsJobSpec[] {
  return Array.from({ length: count }, (_, i) => ({
    identifier: TASK,
    payload: { jobId: randomUUID(), amount: i % 100 } satisfies JobData,
  }));
}

export function runGraphileWorker(spec: RunSpec): Promise<Sample> {
  return withFreshDatabases(spec, [{ label: spec.system, effects: true }], async ([database]) => {
    if (!database) throw new Error("no database");
    const connectionString = database.url;
    const progress = new Progress();
    const task: Task = async (payload, helpers) => {
      const { jobId, amount } = payload as JobData;
      try {
        await helpers.withPgClient((client) =>
          client.query("insert into effects (job_id, amount) values ($1, $2)", [jobId, amount]),
        );
      } catch (error) {
        progress.fail(error);
        throw error;
      }
      progress.add();
    };
    // The runners' pool is ours: ended before the database is dropped (with
    // force), and heard, so a client it still holds when the drop ends its
    // backend does not end the process with an unhandled 'error'.
    const pool = new pg.Pool({ connectionString, max: spec.concurrency + 2 });
    pool.on("error", () => {});
    pool.on("connect", (client) => client.on("error", () => {}));
    const start = (): Promise<Runner> =>
      run({
        taskList: { [TASK]: task },
        noHandleSignals: true,
        logger: quietLogger,
        pgPool: pool,
        preset: {
          worker: {
            connectionString,
            concurrentJobs: spec.concurrency,
            maxPoolSize: spec.concurrency + 2,
            useNodeTime: true,
            localQueue: { size: 500 },
            completeJobBatchDelay: 0,
            failJobBatchDelay: 0,
          },
        },
      });

    const utils = await makeWorkerUtils({ connectionString, logger: quietLogger });
    try {
      await utils.migrate();
      const addAll = async (specs: AddJobsJobSpec[]) => {
        for (let i = 0; i < specs.length; i += ADD_BATCH) await utils.addJobs(specs.slice(i, i + ADD_BATCH));
      };
      const remaining = `select count(*)::int as n from graphile_worker._private_jobs`;

      // Warm-up: its own jobs, its own runner, off the clock.
      await addAll(jobSpecs(spec.warmup));
      const warm = await start();
      await progress.waitFor(spec.warmup, timeoutFor(spec.warmup), "graphile_worker warm-up");
      await pollUntil(connectionString, remaining, 0, timeoutFor(spec.warmup), "graphile_worker warm-up jobs left");
      await warm.stop();

      await addAll(jobSpecs(spec.jobs));
      const meter = await startMeter(connectionString);
      const started = performance.now();
      const runner = await start();
      try {
        await progress.waitFor(spec.warmup + spec.jobs, timeoutFor(spec.jobs), "graphile_worker");
        const ms = performance.now() - started;
        await pollUntil(connectionString, remaining, 0, timeoutFor(spec.jobs), "graphile_worker jobs left");
        const costs = await meter.stop();
        await expectEffects(connectionString, spec.jobs + spec.warmup, spec.system);
        return sampleOf(spec.system, spec.jobs, ms, costs);
      } finally {
        await runner.stop();
      }
    } finally {
      await utils.release();
      await pool.end();
    }
  });
}
