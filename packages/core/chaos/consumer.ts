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

export function chaosConsumer(handle: ConsumerDefinition<typeof chaosSchema>["handle"]) {
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
  });
}

export interface ChaosWorkerConfig {
  readonly index: number;
  /** The run's seed mixed with the worker's index and generation: its faults. */
  readonly workerSeed: number;
  readonly databaseUrl: string;
  /** The hostile broker in front of the fake Vercel Queues server. */
  readonly brokerUrl: string;
  readonly token: string;
  readonly visibilityTimeoutSeconds: number;
  readonly concurrency: number;
  readonly timeoutMs: number;
  /** The database driver of this worker: the engine's contract must hold on each (#18). @default "postgres.js" */
  readonly driver?: "postgres.js" | "node-postgres";
}

/** The tables the chaos handler writes: effects with no unique key (a double effect shows), balances, and the operator's repairs. */
export const CHAOS_TABLES_SQL = `
  create table if not exists chaos_effects (
    job_id uuid not null, consumer text not null, customer text not null, amount integer not null,
    at timestamptz not null default clock_timestamp());
  create index if not exists chaos_effects_job on chaos_effects (job_id);
  create table if not exists chaos_balances (customer text primary key, points bigint not null);
  create table if not exists chaos_repaired (job_id uuid primary key);
`;
