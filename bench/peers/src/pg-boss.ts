/**
 * `pg_boss` (10.4.2), tuned for throughput: two `work()` loops on the queue,
 * each fetching up to 1,000 jobs at a time (`batchSize: 1000`) and polling
 * every 0.5 s (`pollingIntervalSeconds`, pg-boss's minimum) when a fetch
 * found fewer jobs than it could take; one `pg` pool of 10 for pg-boss and
 * the handler (given to pg-boss as its `db`); no cron scheduling
 * (`schedule: false`). The handler inserts all the effects of its batch in
 * one statement (its own autocommit transaction); pg-boss then marks the
 * batch completed: at-least-once.
 *
 * The warm-up runs on a queue of its own, so the timed queue's jobs sit
 * untouched until the clock starts; the clock runs from the two `work()`
 * calls to the last effect; the meter stops once every job is completed.
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import PgBoss from "pg-boss";
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

const POOL_MAX = 10;
const WORKERS = 2;
const WORK_OPTIONS: PgBoss.WorkOptions = { batchSize: 1000, pollingIntervalSeconds: 0.5 };
const INSERT_BATCH = 1000;

export function runPgBoss(spec: RunSpec): Promise<Sample> {
  return withFreshDatabases(spec, [{ label: spec.system, effects: true }], async ([database]) => {
    if (!database) throw new Error("no database");
    const pool = new pg.Pool({ connectionString: database.url, max: POOL_MAX });
    const boss = new PgBoss({
      db: { executeSql: (text, values) => pool.query(text, values) },
      schedule: false,
    });
    const errors: unknown[] = [];
    boss.on("error", (error) => errors.push(error));
    const progress = new Progress();
    const handler = async (jobs: PgBoss.Job<JobData>[]) => {
      try {
        await pool.query("insert into effects (job_id, amount) select * from unnest($1::uuid[], $2::int[])", [
          jobs.map((job) => job.data.jobId),
          jobs.map((job) => job.data.amount),
        ]);
      } catch (error) {
        progress.fail(error);
        throw error;
      }
      progress.add(jobs.length);
    };
    const enqueue = async (queue: string, count: number) => {
      await boss.createQueue(queue);
      for (let i = 0; i < count; i += INSERT_BATCH) {
        await boss.insert(
          Array.from({ length: Math.min(INSERT_BATCH, count - i) }, (_, j) => ({
            name: queue,
            data: { jobId: randomUUID(), amount: (i + j) % 100 } satisfies JobData,
          })),
        );
      }
    };
    const unfinished = (queue: string) =>
      `select count(*)::int as n from pgboss.job where name = '${queue}' and state <> 'completed'`;

    await boss.start();
    try {
      await enqueue("peers_warmup", spec.warmup);
      for (let i = 0; i < WORKERS; i++) await boss.work("peers_warmup", WORK_OPTIONS, handler);
      await progress.waitFor(spec.warmup, timeoutFor(spec.warmup), "pg_boss warm-up");
      await pollUntil(database.url, unfinished("peers_warmup"), 0, timeoutFor(spec.warmup), "pg_boss warm-up");
      await boss.offWork("peers_warmup");

      await enqueue("peers_credit", spec.jobs);
      const meter = await startMeter(database.url);
      const started = performance.now();
      for (let i = 0; i < WORKERS; i++) await boss.work("peers_credit", WORK_OPTIONS, handler);
      await progress.waitFor(spec.warmup + spec.jobs, timeoutFor(spec.jobs), "pg_boss");
      const ms = performance.now() - started;
      await pollUntil(database.url, unfinished("peers_credit"), 0, timeoutFor(spec.jobs), "pg_boss jobs left");
      const costs = await meter.stop();
      if (errors.length > 0) throw new Error(`pg_boss: ${errors.length} errors, the first: ${String(errors[0])}`);
      await expectEffects(database.url, spec.jobs + spec.warmup, spec.system);
      return sampleOf(spec.system, spec.jobs, ms, costs);
    } finally {
      await boss.stop({ graceful: false, wait: true });
      await pool.end();
    }
  });
}
