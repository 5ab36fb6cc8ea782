/**
 * `dbos` (@dbos-inc/dbos-sdk 4.27.6 + @dbos-inc/drizzle-datasource 4.27.6):
 * a queue `peers_credit` with worker concurrency spec.concurrency (16) and a
 * 5 ms polling interval; the workflow `credit` runs one step, a Drizzle
 * data-source transaction that inserts the effect and records the step's
 * output in the application database's `dbos.transaction_completion` in the
 * same transaction (a step that committed is never run again: exactly-once
 * for that step). The system database (workflow status, queue) is a fresh
 * database of its own; pools: system database spec.concurrency + 4, data
 * source spec.concurrency.
 *
 * Jobs are enqueued before the clock with `DBOSClient.enqueueInTransaction`
 * (1,000 per transaction, 4 connections). DBOS starts dispatching a queue at
 * `DBOS.launch()`, so the warm-up is a launch of its own (it also migrates the
 * system database), shut down before the timed jobs are enqueued; the clock
 * runs from the second `DBOS.launch()` to the last effect; the meter stops
 * once every workflow has succeeded.
 */
import { randomUUID } from "node:crypto";
import { DBOS, DBOSClient, WorkflowQueue } from "@dbos-inc/dbos-sdk";
import { DrizzleDataSource } from "@dbos-inc/drizzle-datasource";
import type { NodePgDatabase } from "drizzle-orm/node-postgres";
import pg from "pg";
import type { RunSpec, Sample } from "./config.ts";
import {
  effects,
  expectEffects,
  Progress,
  pollUntil,
  sampleOf,
  startMeter,
  timeoutFor,
  withFreshDatabases,
} from "./measure.ts";

const APP = "softcrum-peers";
const QUEUE = "peers_credit";
const WORKFLOW = "credit";
const ENQUEUE_BATCH = 1000;
const ENQUEUE_CONNECTIONS = 4;

/** Enqueues `count` workflows, `ENQUEUE_BATCH` per transaction of the caller's, on a few connections. */
async function enqueue(client: DBOSClient, systemUrl: string, count: number, first: number): Promise<void> {
  const batches = Array.from({ length: Math.ceil(count / ENQUEUE_BATCH) }, (_, b) => b * ENQUEUE_BATCH);
  await Promise.all(
    Array.from({ length: ENQUEUE_CONNECTIONS }, async () => {
      const conn = new pg.Client({ connectionString: systemUrl });
      await conn.connect();
      try {
        for (let start = batches.shift(); start !== undefined; start = batches.shift()) {
          await conn.query("begin");
          for (let i = start; i < Math.min(start + ENQUEUE_BATCH, count); i++) {
            await client.enqueueInTransaction(
              conn,
              { queueName: QUEUE, workflowName: WORKFLOW, applicationName: APP },
              randomUUID(),
              (first + i) % 100,
            );
          }
          await conn.query("commit");
        }
      } finally {
        await conn.end();
      }
    }),
  );
}

export function runDbos(spec: RunSpec): Promise<Sample> {
  const labels = [
    { label: "dbos", effects: true },
    { label: "dbos_sys", effects: false },
  ];
  return withFreshDatabases(spec, labels, async ([app, system]) => {
    if (!app || !system) throw new Error("no database");
    const progress = new Progress();
    // Typed with this package's (ESM) Drizzle: the data source's own declarations see Drizzle's CommonJS ones.
    // The bench's own pool, with an error listener, ended before the database
    // is dropped: DBOS.shutdown() leaves the data source's pool open, and an
    // idle client the forced drop ends would crash the run with an unhandled
    // 'error' (seen in round 2 of a full run).
    const pool = new pg.Pool({ connectionString: app.url, max: spec.concurrency });
    pool.on("error", () => {});
    const dataSource = new DrizzleDataSource<NodePgDatabase>("peers_app", pool);
    const insertEffect = dataSource.registerTransaction(
      async (jobId: string, amount: number) => {
        await dataSource.client.insert(effects).values({ jobId, amount });
      },
      { name: "insertEffect" },
    );
    DBOS.registerWorkflow(
      async (jobId: string, amount: number) => {
        try {
          await insertEffect(jobId, amount);
        } catch (error) {
          progress.fail(error);
          throw error;
        }
        progress.add();
      },
      { name: WORKFLOW },
    );
    new WorkflowQueue(QUEUE, { workerConcurrency: spec.concurrency, minPollingIntervalMs: 5 });
    DBOS.setConfig({
      name: APP,
      systemDatabaseUrl: system.url,
      systemDatabasePoolSize: spec.concurrency + 4,
      logLevel: "warn",
    });
    const unfinished = `select count(*)::int as n from dbos.workflow_status where status <> 'SUCCESS'`;

    // Warm-up: the first launch migrates the system database, then runs the warm-up jobs.
    await DBOS.launch();
    const client = await DBOSClient.create({ systemDatabaseUrl: system.url, applicationName: APP });
    try {
      await enqueue(client, system.url, spec.warmup, 0);
      await progress.waitFor(spec.warmup, timeoutFor(spec.warmup), "dbos warm-up");
      await pollUntil(system.url, unfinished, 0, timeoutFor(spec.warmup), "dbos warm-up workflows left");
      await DBOS.shutdown();

      await enqueue(client, system.url, spec.jobs, spec.warmup);
      const meter = await startMeter(app.url);
      const started = performance.now();
      await DBOS.launch();
      try {
        await progress.waitFor(spec.warmup + spec.jobs, timeoutFor(spec.jobs), "dbos");
        const ms = performance.now() - started;
        await pollUntil(system.url, unfinished, 0, timeoutFor(spec.jobs), "dbos workflows left");
        const costs = await meter.stop();
        await expectEffects(app.url, spec.jobs + spec.warmup, spec.system);
        return sampleOf(spec.system, spec.jobs, ms, costs);
      } finally {
        await DBOS.shutdown();
      }
    } finally {
      await client.destroy();
      await pool.end();
    }
  });
}
