// The consumer every chaos worker runs, and what the run's processes share.
import { z } from "zod";
import { type ConsumerDefinition, defineConsumer } from "../src/index.ts";

export const CHAOS_CONSUMER = "chaos.award";
export const CHAOS_QUEUE = "chaos.points";
export const CHAOS_KIND = "points.award.v1";

/** What the producer decided for a job: `ok` succeeds once its faults let it; the others fail until the operator repairs them. */
export const FATES = ["ok", "exhaust", "permanent"] as const;

export const chaosSchema = z.object({
  customer: z.string().min(1),
  points: z.number().int().positive(),
  fate: z.enum(FATES),
});
export type ChaosData = z.output<typeof chaosSchema>;

/** Handler bound, in ms: a hung handler is aborted after this. */
export const CHAOS_TIMEOUT_MS = 1_500;

export function chaosConsumer(
  handle: ConsumerDefinition<typeof chaosSchema>["handle"],
  batch?: ChaosWorkerConfig["batch"],
) {
  return defineConsumer({
    name: CHAOS_CONSUMER,
    queue: CHAOS_QUEUE,
    kind: CHAOS_KIND,
    schema: chaosSchema,
    // The platform's 5 attempts, on the run's time scale (the fake broker's
    // clock runs faster than the wall clock, and a lease wait is >= 1 s).
    retry: { maxAttempts: 5, baseDelayMs: 250, maxDelayMs: 2_000 },
    timeoutMs: CHAOS_TIMEOUT_MS,
    // Few customers: their ordering keys collide all the time.
    orderingKey: (data) => data.customer,
    handle,
    ...(batch === undefined ? {} : { batch }),
  });
}

export interface ChaosWorkerConfig {
  readonly index: number;
  /** The run's seed mixed with the worker's index and generation: its faults. */
  readonly workerSeed: number;
  readonly databaseUrl: string;
  /**
   * The hostile broker in front of the fake Vercel Queues server, with
   * `/w/<index>.<generation>` after it: the broker knows who received each lease.
   */
  readonly brokerUrl: string;
  readonly token: string;
  readonly visibilityTimeoutSeconds: number;
  readonly concurrency: number;
  readonly timeoutMs: number;
  /** The database driver of this worker: the engine's contract must hold on each (#18). @default "postgres.js" */
  readonly driver?: "postgres.js" | "node-postgres";
  /**
   * Batched work transactions (#23): the deliveries this worker has in
   * flight at once share a transaction, and a SIGKILL lands mid-batch.
   * @default none (one transaction per job)
   */
  readonly batch?: { readonly maxSize: number; readonly maxWaitMs: number; readonly concurrent?: boolean };
  /**
   * The file this worker process (this generation of its slot) appends its
   * delivery records to, one JSON line each (`DeliveryRecord`), written
   * synchronously before the work they announce: a SIGKILL does not erase
   * a handler run that began.
   */
  readonly runLog: string;
}

/**
 * What a worker records of each delivery of a job (`d`: the delivery's
 * number in this process; `t`: epoch ms): `recv` when the adapter hands it to
 * the harness, `run` when the handler starts (with the attempt number the
 * harness gave it, `ctx.attempt`), `end` when the harness has answered,
 * `settled` when the adapter has answered the service for it (its delivery
 * event: the action, and whether it applied); and `incident`, each incident the Vercel adapter reported (its kind, message
 * and that message's job when this process handed it to the harness).
 */
export type DeliveryRecord =
  | {
      readonly e: "recv";
      readonly d: number;
      readonly t: number;
      readonly job: string;
      /** The message's id, and the attempt number the adapter handed the harness. */
      readonly msg: string;
      readonly n: number;
    }
  | { readonly e: "run"; readonly d: number | undefined; readonly t: number; readonly job: string; readonly a: number }
  | { readonly e: "end"; readonly d: number; readonly t: number; readonly o: string }
  | {
      readonly e: "settled";
      readonly t: number;
      readonly msg: string;
      readonly action: string;
      readonly applied: boolean;
    }
  | {
      readonly e: "incident";
      readonly t: number;
      readonly kind: string;
      readonly msg: string | undefined;
      readonly job: string | undefined;
    };

/** The tables the chaos handler writes: effects with no unique key (a double effect shows), balances, and the operator's repairs. */
export const CHAOS_TABLES_SQL = `
  create table if not exists chaos_effects (
    job_id uuid not null, consumer text not null, customer text not null, amount integer not null,
    at timestamptz not null default clock_timestamp());
  create index if not exists chaos_effects_job on chaos_effects (job_id);
  create table if not exists chaos_balances (customer text primary key, points bigint not null);
  create table if not exists chaos_repaired (job_id uuid primary key);
`;
