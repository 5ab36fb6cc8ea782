/**
 * Bulk replay batches (seed 002): a filter selects pending letters once, at
 * creation; a large batch needs an approver other than the requester; an
 * optional sample runs first and the rest waits until the sample's jobs
 * succeeded; replays go out at the batch's own rate limit, a chunk
 * (`batchSize`) at a time, and after each chunk the batch pauses itself when
 * too many of its replayed jobs failed again. It can be paused, resumed and
 * stopped, and it expires. The row keeps filter, people, reason, timings,
 * counts and why it stopped.
 */
import { hostname } from "node:os";
import { and, asc, desc, eq, gt, inArray, isNull, lt, or, sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { z } from "zod";
import {
  deadLetters,
  REPLAY_BATCH_STATUSES,
  type ReplayBatchRow,
  type ReplayBatchStatus,
  replayBatches,
  replayBatchItems,
} from "../db/schema.ts";
import { OpsError } from "../errors.ts";
import { type DeadLetterFilter, deadLetterFilterSchema, operatorSchema, parseInput, reasonSchema } from "./filters.ts";
import { type DeadLetterOperations, filterConditions, operatorName, rowsOf } from "./operations.ts";

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
}

export const DEFAULT_BATCH_POLICY: BatchPolicy = {
  approvalThreshold: 100,
  leaseMs: 60_000,
  pollIntervalMs: 500,
  // Longer than the default retry window (7.5 min): a sample job may retry before it resolves.
  sampleTimeoutMs: 600_000,
  minResolvedForRate: 5,
};

const createSchema = z.strictObject({
  filter: deadLetterFilterSchema.default({}),
  operator: operatorSchema,
  reason: reasonSchema,
  /** Replays per second, this batch's own capacity, apart from live traffic. */
  ratePerSecond: z.coerce.number().positive().max(1000),
  /** Letters replayed between two checks of the stop conditions. */
  batchSize: z.coerce.number().int().positive().max(10_000).default(50),
  /** Replay this many first and continue only if none of them fails again. */
  sampleSize: z.coerce.number().int().positive().optional(),
  /** Pause when more than this share of resolved replayed jobs failed again. */
  maxFailureRate: z.coerce.number().gt(0).max(1).default(0.2),
  /** At most this many letters (oldest first). */
  limit: z.coerce.number().int().positive().max(100_000).optional(),
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
  /** Replayed jobs whose fence exists now (they succeeded, or had already). */
  readonly succeeded: number;
  /** Replayed jobs neither succeeded nor failed again yet (in flight or retrying). */
  readonly unresolved: number;
  readonly pending: number;
}

export interface BatchProgress {
  readonly batch: BatchView;
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
}

const TERMINAL: readonly ReplayBatchStatus[] = ["completed", "stopped", "expired"];

export class ReplayBatches {
  readonly #ops: DeadLetterOperations;
  readonly #policy: BatchPolicy;

  constructor(ops: DeadLetterOperations, policy: Partial<BatchPolicy> = {}) {
    this.#ops = ops;
    this.#policy = { ...DEFAULT_BATCH_POLICY, ...policy };
  }

  get #db() {
    return this.#ops.db;
  }
  #now(): Date {
    return new Date(this.#ops.clock.now());
  }

  /** Selects the pending letters that match, and records the batch (awaiting approval when large). */
  async create(input: CreateBatchInput): Promise<BatchView> {
    const id = uuidv7();
    const scope = { batchId: id, filter: input?.filter, reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.create", scope, async () => {
      const parsed = parseInput(createSchema, input, "batch");
      if (parsed.expiresAt && parsed.expiresInMinutes) {
        throw new OpsError("INVALID_INPUT", "invalid batch: give expiresAt or expiresInMinutes, not both");
      }
      const now = this.#now();
      const expiresAt = parsed.expiresAt ?? new Date(now.getTime() + (parsed.expiresInMinutes ?? 24 * 60) * 60_000);
      if (expiresAt <= now) throw new OpsError("INVALID_INPUT", "invalid batch: expiresAt is in the past");
      if (parsed.filter.status && parsed.filter.status !== "pending_review") {
        throw new OpsError(
          "INVALID_INPUT",
          "invalid batch: a batch replays pending_review letters only; drop filter.status",
        );
      }
      const filter = { ...parsed.filter, status: undefined };
      await this.#db.transaction(async (tx) => {
        const letters = await tx
          .select({ id: deadLetters.id })
          .from(deadLetters)
          .where(and(eq(deadLetters.status, "pending_review"), ...filterConditions(filter)))
          .orderBy(asc(deadLetters.id))
          .limit(parsed.limit ?? 100_000);
        if (letters.length === 0) throw new OpsError("INVALID_INPUT", "the filter selects no pending dead letter");
        await tx.insert(replayBatches).values({
          id,
          status: letters.length > this.#policy.approvalThreshold ? "awaiting_approval" : "ready",
          filter: jsonFilter(parsed.filter),
          requestedBy: parsed.operator,
          reason: parsed.reason,
          ratePerSecond: parsed.ratePerSecond,
          batchSize: parsed.batchSize,
          sampleSize: parsed.sampleSize ?? null,
          maxFailureRate: parsed.maxFailureRate,
          expiresAt,
          selected: letters.length,
          createdAt: now,
        });
        const sample = parsed.sampleSize ?? 0;
        for (let i = 0; i < letters.length; i += 1000) {
          await tx
            .insert(replayBatchItems)
            .values(
              letters
                .slice(i, i + 1000)
                .map((l, j) => ({ batchId: id, deadLetterId: l.id, position: i + j, inSample: i + j < sample })),
            );
        }
      });
      return this.get(id);
    });
  }

  /** A second operator approves a large batch; the requester cannot approve their own. */
  async approve(id: string, input: { operator: string }): Promise<BatchView> {
    return this.#ops.audited(operatorName(input?.operator), "batch.approve", { batchId: id }, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const batch = await this.#load(id);
      if (batch.requestedBy === operator) {
        throw new OpsError(
          "FORBIDDEN",
          `${operator} requested batch ${id} and cannot approve it; another operator must`,
        );
      }
      await this.#transition(id, ["awaiting_approval"], "ready", { approvedBy: operator, approvedAt: this.#now() });
      return this.get(id);
    });
  }

  async pause(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: id, reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.pause", scope, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      await this.#transition(id, ["ready", "running"], "paused", { stopReason: `paused by ${operator}: ${reason}` });
      return this.get(id);
    });
  }

  /**
   * Makes a paused batch runnable again. Resuming a batch its sample paused is
   * the operator's decision to go on anyway; the failure rate counts afresh from now.
   */
  async resume(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: id, reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.resume", scope, async () => {
      parseInput(operatorSchema, input?.operator, "operator");
      parseInput(reasonSchema, input?.reason, "reason");
      const batch = await this.#load(id);
      const now = this.#now();
      await this.#transition(id, ["paused"], "ready", {
        stopReason: null,
        rateWindowStart: now,
        // Only a sample that ran and failed is accepted by resuming; a pause
        // for any other reason keeps the sample requirement.
        ...(batch.sampleSize && !batch.samplePassedAt && batch.stopReason?.startsWith("sample:")
          ? { samplePassedAt: now }
          : {}),
      });
      return this.get(id);
    });
  }

  async stop(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: id, reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.stop", scope, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      await this.#transition(id, ["awaiting_approval", "ready", "running", "paused"], "stopped", {
        stopReason: `stopped by ${operator}: ${reason}`,
        endedAt: this.#now(),
      });
      return this.get(id);
    });
  }

  /** The batch with live counts: how many replayed jobs succeeded, failed again, or are unresolved. */
  async get(id: string): Promise<BatchView> {
    const batch = await this.#load(id);
    const stats = await this.#stats(id, null);
    const [pending] = await this.#db
      .select({ n: sql<number>`count(*)::int` })
      .from(replayBatchItems)
      .where(and(eq(replayBatchItems.batchId, id), eq(replayBatchItems.state, "pending")));
    return {
      ...batch,
      failedAgain: stats.failedAgain,
      succeeded: stats.succeeded,
      unresolved: stats.unresolved,
      pending: pending?.n ?? 0,
    };
  }

  async list(options: { status?: ReplayBatchStatus; limit?: number } = {}): Promise<ReplayBatchRow[]> {
    // A misspelt status is an error, never an empty (or wider) list.
    const status = parseInput(z.enum(REPLAY_BATCH_STATUSES).optional(), options.status, "status");
    return this.#db
      .select()
      .from(replayBatches)
      .where(status ? eq(replayBatches.status, status) : undefined)
      .orderBy(desc(replayBatches.id))
      .limit(Math.min(Math.max(options.limit ?? 50, 1), 500));
  }

  /**
   * Runs the batch until it completes, pauses, is stopped or expires (or
   * `maxDurationMs` passes). One runner at a time: a lease on the row, renewed
   * before every replay together with the check that the batch is still
   * running and unexpired, so a pause, stop or expiry takes effect at the next
   * letter and a runner that lost its lease stops.
   */
  async run(id: string, options: RunOptions): Promise<BatchView> {
    const operator = parseInput(operatorSchema, options?.operator, "operator");
    const runner = `${operator}@${hostname()}:${process.pid}:${uuidv7().slice(-8)}`;
    const clock = this.#ops.clock;
    const startedAt = clock.now();
    let published = 0;

    const first = await this.#load(id);
    if (first.status === "awaiting_approval")
      throw new OpsError("CONFLICT", `batch ${id} awaits approval by a second operator`);
    if (first.status === "paused") {
      throw new OpsError("CONFLICT", `batch ${id} is paused (${first.stopReason ?? "no reason"}); resume it first`);
    }
    if (TERMINAL.includes(first.status)) return this.get(id);
    if (first.expiresAt.getTime() <= startedAt) return this.#finish(id, "expired", "expired before it finished");

    await this.#ops.audit({
      operator,
      action: "batch.run",
      scope: { batchId: id },
      result: "ok",
      detail: `runner ${runner}`,
    });
    const leased = await this.#db
      .update(replayBatches)
      .set({
        status: "running",
        leaseOwner: runner,
        leaseExpiresAt: new Date(startedAt + this.#policy.leaseMs),
        startedAt: first.startedAt ?? this.#now(),
        rateWindowStart: first.rateWindowStart ?? this.#now(),
      })
      .where(
        and(
          eq(replayBatches.id, id),
          inArray(replayBatches.status, ["ready", "running"]),
          or(isNull(replayBatches.leaseOwner), lt(replayBatches.leaseExpiresAt, this.#now())),
        ),
      )
      .returning({ id: replayBatches.id });
    if (leased.length === 0)
      throw new OpsError("CONFLICT", `batch ${id} is being run by another runner (or changed state)`);

    /** Renews the lease if this runner still holds a running, unexpired batch; false means stop. */
    const stillMine = async () => {
      const renewed = await this.#db
        .update(replayBatches)
        .set({ leaseExpiresAt: new Date(clock.now() + this.#policy.leaseMs) })
        .where(
          and(
            eq(replayBatches.id, id),
            eq(replayBatches.leaseOwner, runner),
            eq(replayBatches.status, "running"),
            gt(replayBatches.expiresAt, this.#now()),
          ),
        )
        .returning({ id: replayBatches.id });
      return renewed.length > 0;
    };
    const pauseIfRunning = (stopReason: string) =>
      this.#db
        .update(replayBatches)
        .set({ status: "paused", stopReason })
        .where(
          and(eq(replayBatches.id, id), eq(replayBatches.status, "running"), eq(replayBatches.leaseOwner, runner)),
        );

    const intervalMs = 1000 / first.ratePerSecond;
    // The next replay's earliest time; waiting (for a sample) earns no credit,
    // so the batch never bursts above its rate.
    let nextDue = startedAt + intervalMs;
    const progress = async () => {
      if (!options.onProgress) return;
      const batch = await this.get(id);
      const elapsed = Math.max(1, clock.now() - startedAt) / 1000;
      options.onProgress({ batch, rate: published / elapsed, etaSeconds: batch.pending / first.ratePerSecond });
    };

    try {
      for (;;) {
        const batch = await this.#load(id);
        if (batch.status !== "running" || batch.leaseOwner !== runner) return this.get(id);
        if (batch.expiresAt.getTime() <= clock.now()) return this.#finish(id, "expired", "expired before it finished");
        if (options.signal?.aborted) {
          await pauseIfRunning(`interrupted: runner of ${operator} was stopped`);
          return this.get(id);
        }
        if (options.maxDurationMs !== undefined && clock.now() - startedAt >= options.maxDurationMs)
          return this.get(id);

        const inSample = Boolean(batch.sampleSize) && !batch.samplePassedAt;
        const items = await this.#db
          .select({ deadLetterId: replayBatchItems.deadLetterId })
          .from(replayBatchItems)
          .where(
            and(
              eq(replayBatchItems.batchId, id),
              eq(replayBatchItems.state, "pending"),
              inSample ? eq(replayBatchItems.inSample, true) : undefined,
            ),
          )
          .orderBy(asc(replayBatchItems.position))
          .limit(batch.batchSize);

        if (inSample && items.length === 0) {
          const verdict = await this.#awaitSample(id, stillMine, options.signal);
          if (verdict === "lost") continue; // paused, stopped, expired or taken over: the top of the loop says which
          if (verdict !== "passed") {
            await pauseIfRunning(verdict);
            return this.get(id);
          }
          await this.#db.update(replayBatches).set({ samplePassedAt: this.#now() }).where(eq(replayBatches.id, id));
          continue;
        }
        if (items.length === 0) return this.#finish(id, "completed", null);

        for (const item of items) {
          const wait = nextDue - clock.now();
          if (wait > 0) await sleep(wait, options.signal);
          if (options.signal?.aborted || !(await stillMine())) break;
          nextDue = Math.max(nextDue, clock.now()) + intervalMs;
          const result = await this.#ops.replayOne(item.deadLetterId, {
            operator,
            reason: `batch ${id}: ${batch.reason}`,
            batchId: id,
          });
          if (result.outcome === "failed") {
            await pauseIfRunning(`replay failed: ${result.detail}`);
            return this.get(id);
          }
          published += 1;
          // A letter this batch already replayed (an earlier runner of it) counts as replayed.
          const replayed =
            result.outcome === "replayed" || (result.outcome === "not_pending" && result.replayBatchId === id);
          const changed = await this.#db
            .update(replayBatchItems)
            .set({ state: replayed ? "replayed" : "skipped", replayedAt: this.#now() })
            .where(
              and(
                eq(replayBatchItems.batchId, id),
                eq(replayBatchItems.deadLetterId, item.deadLetterId),
                eq(replayBatchItems.state, "pending"),
              ),
            )
            .returning({ id: replayBatchItems.deadLetterId });
          if (changed.length > 0) {
            await this.#db
              .update(replayBatches)
              .set(
                replayed
                  ? { replayed: sql`${replayBatches.replayed} + 1` }
                  : { skipped: sql`${replayBatches.skipped} + 1` },
              )
              .where(eq(replayBatches.id, id));
          }
        }

        // The window first, the whole batch after: failures only grow, so the
        // counts recorded (and the metric) never lag behind what the pause
        // decision below saw.
        const window = await this.#stats(id, batch.rateWindowStart);
        const overall = await this.#stats(id, null);
        if (overall.failedAgain > batch.failedAgain)
          this.#ops.metrics.failedAgain(overall.failedAgain - batch.failedAgain);
        await this.#db.update(replayBatches).set({ failedAgain: overall.failedAgain }).where(eq(replayBatches.id, id));
        const resolved = window.succeeded + window.failedAgain;
        if (
          !inSample &&
          resolved >= this.#policy.minResolvedForRate &&
          window.failedAgain / resolved > batch.maxFailureRate
        ) {
          const rate = Math.round((window.failedAgain / resolved) * 100);
          await pauseIfRunning(
            `failure rate ${rate}% (${window.failedAgain} of ${resolved} resolved replays failed again) is over ${Math.round(batch.maxFailureRate * 100)}%`,
          );
          return this.get(id);
        }
        await progress();
      }
    } finally {
      await this.#db
        .update(replayBatches)
        .set({ leaseOwner: null, leaseExpiresAt: null })
        .where(and(eq(replayBatches.id, id), eq(replayBatches.leaseOwner, runner)));
      await progress().catch(() => {});
    }
  }

  /**
   * Waits until every sample job succeeded or one failed again (a timeout is a
   * failure to decide), keeping the lease; "lost" when the batch stopped being
   * this runner's to run.
   */
  async #awaitSample(id: string, stillMine: () => Promise<boolean>, signal: AbortSignal | undefined): Promise<string> {
    const clock = this.#ops.clock;
    const deadline = clock.now() + this.#policy.sampleTimeoutMs;
    for (;;) {
      if (!(await stillMine())) return "lost";
      const stats = await this.#stats(id, null, true);
      if (stats.failedAgain > 0) return `sample: ${stats.failedAgain} of ${stats.replayed} sample jobs failed again`;
      if (stats.unresolved === 0) return "passed";
      if (signal?.aborted) return "interrupted while waiting for the sample";
      if (clock.now() >= deadline) {
        return `sample: ${stats.unresolved} of ${stats.replayed} sample jobs did not resolve within ${this.#policy.sampleTimeoutMs} ms`;
      }
      await sleep(this.#policy.pollIntervalMs, signal);
    }
  }

  /**
   * For the batch's replayed items (since `since`, or only the sample): how
   * many jobs now have a fence (succeeded) and how many have a newer dead
   * letter of the same job and consumer (failed again).
   */
  async #stats(id: string, since: Date | null, sampleOnly = false) {
    const result = await this.#db.execute(sql`
      select count(*)::int as replayed,
             count(*) filter (where f.failed)::int as failed_again,
             count(*) filter (where not f.failed and f.succeeded)::int as succeeded
      from core.replay_batch_items i
      join core.dead_letters d on d.id = i.dead_letter_id
      cross join lateral (
        select exists (select 1 from core.processed_jobs p where p.job_id = d.job_id::uuid and p.consumer = d.consumer) as succeeded,
               -- failed again: a later letter of the job whose latest earlier replay is this one
               exists (select 1 from core.dead_letters n
                       where n.job_id = d.job_id and n.consumer = d.consumer and n.id <> d.id
                         and n.created_at >= d.status_changed_at
                         and not exists (select 1 from core.dead_letters o
                                         where o.job_id = d.job_id and o.consumer = d.consumer and o.id <> d.id
                                           and o.status = 'replayed'
                                           and o.status_changed_at > d.status_changed_at
                                           and o.status_changed_at <= n.created_at)) as failed
      ) f
      where i.batch_id = ${id} and i.state = 'replayed'
        ${since ? sql`and i.replayed_at >= ${since.toISOString()}::timestamptz` : sql``}
        ${sampleOnly ? sql`and i.in_sample` : sql``}`);
    const [row] = rowsOf<{ replayed: number; failed_again: number; succeeded: number }>(result);
    const replayed = row?.replayed ?? 0;
    const failedAgain = row?.failed_again ?? 0;
    const succeeded = row?.succeeded ?? 0;
    return { replayed, failedAgain, succeeded, unresolved: replayed - failedAgain - succeeded };
  }

  async #load(id: string): Promise<ReplayBatchRow> {
    const batchId = parseInput(z.uuid({ error: "must be a batch id (UUID)" }), id, "batch id");
    const [batch] = await this.#db.select().from(replayBatches).where(eq(replayBatches.id, batchId));
    if (!batch) throw new OpsError("NOT_FOUND", `no replay batch ${id}`);
    return batch;
  }

  /** A conditional state change: it happens only from one of `from`, else CONFLICT saying the current state. */
  async #transition(
    id: string,
    from: ReplayBatchStatus[],
    to: ReplayBatchStatus,
    set: Partial<typeof replayBatches.$inferInsert>,
  ) {
    // Validated before the query: a malformed id is bad input (400, exit 2), never a database error.
    parseInput(z.uuid({ error: "must be a batch id (UUID)" }), id, "batch id");
    const changed = await this.#db
      .update(replayBatches)
      .set({ ...set, status: to })
      .where(and(eq(replayBatches.id, id), inArray(replayBatches.status, from)))
      .returning({ id: replayBatches.id });
    if (changed.length === 0) {
      const batch = await this.#load(id);
      throw new OpsError("CONFLICT", `batch ${id} is ${batch.status}; it must be ${from.join(" or ")} to become ${to}`);
    }
  }

  async #finish(id: string, status: "completed" | "expired", reason: string | null): Promise<BatchView> {
    await this.#db
      .update(replayBatches)
      .set({ status, stopReason: reason, endedAt: this.#now(), leaseOwner: null, leaseExpiresAt: null })
      .where(and(eq(replayBatches.id, id), inArray(replayBatches.status, ["ready", "running"])));
    return this.get(id);
  }
}

/** The filter as stored: dates as ISO strings. */
function jsonFilter(filter: z.output<typeof deadLetterFilterSchema>) {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(filter)) {
    if (value !== undefined) out[key] = value instanceof Date ? value.toISOString() : String(value);
  }
  return out;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

export type { DeadLetterFilter };
