/**
 * A replay batch's input and views (moved out of batches.ts): the policy and
 * its defaults, the bounds and schema of `create`, and what `get` and `run`
 * return.
 */
import { z } from "zod";
import type { ReplayBatchRow } from "../db/schema.ts";
import { OpsError } from "../errors.ts";
import { deadLetterFilterSchema, operatorSchema, reasonSchema } from "./filters.ts";
import { MAX_BATCH_LIFETIME_MS } from "./replay-claim.ts";
import { DEFAULT_MAX_LATENCY_MULTIPLE, DEFAULT_MAX_RATE_LIMITED_MULTIPLE } from "./strain.ts";

export interface BatchPolicy {
  /** Batches selecting more letters than this need an approver who is not the requester. @default 100 */
  readonly approvalThreshold: number;
  /** How long a runner holds a batch before another may take it over. @default 60_000 */
  readonly leaseMs: number;
  /** How often the runner looks whether the sample's jobs resolved. @default 500 */
  readonly pollIntervalMs: number;
  /** How long the sample may take to resolve before the batch pauses. @default 600_000 */
  readonly sampleTimeoutMs: number;
  /** Jobs that must have resolved before the failure rate can pause the batch. @default 5 */
  readonly minResolvedForRate: number;
  /**
   * Replays of one runner in flight at once: replays start at the batch's
   * rate, and this many may still be publishing, so the rate is kept however
   * long one publish takes. @default 32
   */
  readonly maxInFlight: number;
  /**
   * The rolling window over which `approvalThreshold` counts what one
   * requester replays: unapproved batches and direct replays together.
   * @default 86_400_000 (24 h)
   */
  readonly approvalWindowMs: number;
}

export const DEFAULT_BATCH_POLICY: BatchPolicy = {
  approvalThreshold: 100,
  leaseMs: 60_000,
  pollIntervalMs: 500,
  // Longer than the default retry window (7.5 min): a sample job may retry before it resolves.
  sampleTimeoutMs: 600_000,
  minResolvedForRate: 5,
  maxInFlight: 32,
  approvalWindowMs: 86_400_000,
};

/** A batch's bounds (#21 item 1): its rate, its letters (and sample), its life. */
export const MIN_RATE_PER_SECOND = 0.001;
export const MAX_RATE_PER_SECOND = 1000;
export const MAX_BATCH_LETTERS = 100_000;
export const DEFAULT_MAX_DUPLICATE_RATE = 0.5;
export const DEFAULT_RATE_FLOOR_PER_SECOND = 0.1;

export const createSchema = z.strictObject({
  filter: deadLetterFilterSchema.default({}),
  operator: operatorSchema,
  reason: reasonSchema,
  /**
   * Replays per second, this batch's own capacity, apart from live traffic:
   * from one per 1,000 s to 1,000/s. With `rateShareOfLive`, the ceiling.
   */
  ratePerSecond: z.coerce.number().min(MIN_RATE_PER_SECOND).max(MAX_RATE_PER_SECOND),
  /** Pace the batch at this share of its consumers' live throughput (0.1: 10 %), between `rateFloorPerSecond` and `ratePerSecond`. */
  rateShareOfLive: z.coerce.number().gt(0).max(1).optional(),
  /** The paced rate's floor. @default 0.1 per second (or `ratePerSecond` if lower) */
  rateFloorPerSecond: z.coerce.number().min(MIN_RATE_PER_SECOND).max(MAX_RATE_PER_SECOND).optional(),
  /** Letters replayed between two checks of the stop conditions. */
  batchSize: z.coerce.number().int().positive().max(10_000).default(50),
  /** Replay this many first and continue only if none of them fails again. */
  sampleSize: z.coerce.number().int().positive().max(MAX_BATCH_LETTERS).optional(),
  /** Pause when more than this share of resolved replayed jobs failed again. */
  maxFailureRate: z.coerce.number().gt(0).max(1).default(0.2),
  /**
   * Pause when more than this share of resolved replays hit a fence that was
   * there before the replay (the work was done: the selection is wrong, or a
   * fix already ran). Counted from `minResolvedForRate` resolved replays on.
   */
  maxDuplicateRate: z.coerce.number().gt(0).max(1).default(DEFAULT_MAX_DUPLICATE_RATE),
  /**
   * Pause when the consumers' rate-limited share of deliveries during the
   * batch passes this multiple of the share before it (dependency strain).
   */
  maxRateLimitedMultiple: z.coerce.number().min(1).max(100).default(DEFAULT_MAX_RATE_LIMITED_MULTIPLE),
  /** Pause when the consumers' handler p95 during the batch passes this multiple of the p95 before it. */
  maxLatencyMultiple: z.coerce.number().min(1).max(100).default(DEFAULT_MAX_LATENCY_MULTIPLE),
  /** At most this many letters (oldest first). */
  limit: z.coerce.number().int().positive().max(MAX_BATCH_LETTERS).optional(),
  /** The batch does not run after this. */
  expiresAt: z.union([z.date(), z.iso.datetime({ offset: true }).transform((t) => new Date(t))]).optional(),
  expiresInMinutes: z.coerce
    .number()
    .positive()
    .max(60 * 24 * 30)
    .optional(),
});
export type CreateBatchInput = z.input<typeof createSchema>;

export interface BatchView extends ReplayBatchRow {
  /** Replayed jobs whose fence the replay made (they succeeded). */
  readonly succeeded: number;
  /** Replayed jobs whose fence was already there before the replay (`duplicates` on the row, plus what is resolved live). */
  readonly duplicates: number;
  /** Replayed jobs neither succeeded, duplicate nor failed again yet (in flight or retrying). */
  readonly unresolved: number;
  readonly pending: number;
  /**
   * The recovery proof (#21 item 7): every replayed job resolved — succeeded,
   * duplicate or failed again — and nothing left to replay. Until then a
   * batch is not done, whatever its status says.
   */
  readonly recovered: boolean;
  /** From the batch's start to the last replayed job's resolution, once `recovered`; else null. */
  readonly timeToRecoveryMs: number | null;
}

export interface BatchProgress {
  readonly batch: BatchView;
  /** The rate the runner paces at now: the batch's fixed rate, or its share of live traffic within its floor and ceiling. */
  readonly pacedPerSecond: number;
  /** Replays per second over this run. */
  readonly rate: number;
  /** Seconds left at the batch's rate limit. */
  readonly etaSeconds: number;
}

export interface RunOptions {
  readonly operator: string;
  readonly onProgress?: (progress: BatchProgress) => void;
  /** Stop this run (the batch stays running, another run continues it) after this long, for HTTP calls. @default none */
  readonly maxDurationMs?: number;
  /** Aborting pauses the batch (e.g. Ctrl-C in the CLI). */
  readonly signal?: AbortSignal;
  /**
   * Asked once the sample passed, with its outcomes beside the selection's
   * error classes, when letters are left: false (or a throw) pauses the
   * batch for review (resuming it accepts the sample). @default go on
   */
  readonly confirmSample?: (report: SampleReport) => Promise<boolean>;
}

/** A batch's sample, job by job, beside what its whole selection failed with (#21 item 7). */
export interface SampleReport {
  readonly batchId: string;
  readonly items: readonly {
    readonly deadLetterId: string;
    /** Why the letter was dead-lettered. */
    readonly errorClass: string;
    readonly lastError: string;
    /** What the replay did: succeeded, duplicate (already done), failed_again. */
    readonly outcome: string;
    /** For a replay that failed again: its new letter's class and error. */
    readonly newErrorClass: string | null;
    readonly newError: string | null;
  }[];
  /** The whole selection's letters by error class. */
  readonly selection: Readonly<Record<string, number>>;
  /** Letters left to replay after the sample. */
  readonly remaining: number;
}

/** The filter as stored: dates as ISO strings. */
export function jsonFilter(filter: z.output<typeof deadLetterFilterSchema>) {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(filter)) {
    if (value !== undefined) out[key] = value instanceof Date ? value.toISOString() : String(value);
  }
  return out;
}

/**
 * The checks of a batch's input the schema alone cannot make, against `now`:
 * its expiry (from `expiresAt` or `expiresInMinutes`, in the future, at most
 * 30 days ahead), the paced rate's floor (only with a share, not above the
 * ceiling) and the filter's status. Throws INVALID_INPUT.
 */
export function checkedBatchInput(
  parsed: z.output<typeof createSchema>,
  now: Date,
): { expiresAt: Date; rateFloor: number | null } {
  const expiresAt = parsed.expiresAt ?? new Date(now.getTime() + (parsed.expiresInMinutes ?? 24 * 60) * 60_000);
  if (expiresAt <= now) throw new OpsError("INVALID_INPUT", "invalid batch: expiresAt is in the past");
  if (parsed.rateFloorPerSecond !== undefined && parsed.rateShareOfLive === undefined) {
    throw new OpsError("INVALID_INPUT", "invalid batch: rateFloorPerSecond is for a batch paced by rateShareOfLive");
  }
  const rateFloor =
    parsed.rateShareOfLive === undefined
      ? null
      : (parsed.rateFloorPerSecond ?? Math.min(DEFAULT_RATE_FLOOR_PER_SECOND, parsed.ratePerSecond));
  if (rateFloor !== null && rateFloor > parsed.ratePerSecond) {
    throw new OpsError("INVALID_INPUT", "invalid batch: rateFloorPerSecond is above ratePerSecond (the ceiling)");
  }
  if (expiresAt.getTime() > now.getTime() + MAX_BATCH_LIFETIME_MS) {
    throw new OpsError(
      "INVALID_INPUT",
      "invalid batch: expiresAt is more than 30 days ahead (a batch lives at most 30 days)",
    );
  }
  if (parsed.filter.status && parsed.filter.status !== "pending_review") {
    throw new OpsError(
      "INVALID_INPUT",
      "invalid batch: a batch replays pending_review letters only; drop filter.status",
    );
  }
  return { expiresAt, rateFloor };
}

/** What `ops_batch_set` does (drizzle/0018_ops_roles.sql). */
export type BatchAction =
  | "pause"
  | "stop"
  | "resume"
  | "lease"
  | "renew"
  | "renew_unexpired"
  | "pause_running"
  | "await_approval"
  | "sample_passed"
  | "release"
  | "complete"
  | "expire";

/**
 * A batch's id as the audit records it: lower case, as the database prints
 * a uuid, so `scope->>'batchId' = '<batch-id>'` finds the entries of a
 * control given the id in upper case (the API accepts either).
 */
export function scopeId(id: unknown): unknown {
  return typeof id === "string" ? id.toLowerCase() : id;
}
