/**
 * Bulk replay batches (seed 002): a filter selects pending letters once, at
 * creation; a large batch needs an approver other than the requester; an
 * optional sample runs first and the rest waits until the sample's jobs
 * succeeded; replays go out at the batch's own rate limit, a chunk
 * (`batchSize`) at a time, and after each chunk the batch pauses itself when
 * too many of its replayed jobs failed again. It can be paused, resumed and
 * stopped, and it expires. The row keeps filter, people, reason, timings,
 * counts and why it stopped.
 *
 * Bounded work per step (#10 item 10): the counts are kept incrementally on
 * the row; each step resolves at most `RESOLVE_PAGE` replayed items (an item
 * remembers whether its job succeeded or failed again, which is final), so a
 * step costs the same at the 100,000th letter as at the first.
 */
import { hostname } from "node:os";
import { and, asc, desc, eq, lt, sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { z } from "zod";
import { consumersOf, reportedVersions } from "../db/consumer-versions.ts";
import {
  deadLetters,
  REPLAY_BATCH_STATUSES,
  type ReplayBatchRow,
  type ReplayBatchStatus,
  replayBatches,
  replayBatchItems,
} from "../db/schema.ts";
import { describeError, OpsError } from "../errors.ts";
import { sleep } from "../timers.ts";
import {
  awaitSample,
  expiredForDatabase,
  reviewSample,
  stopBetweenChunks,
  strainBaseline,
  versionMoved,
} from "./batch-guards.ts";
import {
  type BatchAction,
  type BatchPolicy,
  type BatchView,
  type CreateBatchInput,
  checkedBatchInput,
  createSchema,
  DEFAULT_BATCH_POLICY,
  jsonFilter,
  MAX_BATCH_LETTERS,
  type RunOptions,
  scopeId,
} from "./batch-input.ts";
import { recordItem, recoveryOf, resolveReplayed, unresolvedNow, viewOf } from "./batch-resolution.ts";
import { operatorSchema, parseInput, reasonSchema } from "./filters.ts";
import { type BatchHalt, type DeadLetterOperations, filterConditions, operatorName, rowsOf } from "./operations.ts";
import { batchConsumers, liveRatePerSecond, pacedRate } from "./pacing.ts";
import { markAudited } from "./refusals.ts";

/** How far behind its schedule a runner may catch up (its own bookkeeping), at most. */
const CATCH_UP_MS = 250;

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
      const { expiresAt, rateFloor } = checkedBatchInput(parsed, now);
      const filter = { ...parsed.filter, status: undefined };
      // The threshold counts what this requester replayed without approval
      // over the window too: splitting a selection (`limit`) does not avoid it.
      await this.#db.transaction(
        async (tx) => {
          // Counted under the requester's quota lock (see lockReplayQuota): two
          // batches created at once, or a batch and a direct replay, cannot
          // both pass the threshold by counting before the other commits.
          await this.#ops.lockReplayQuota(tx, parsed.operator);
          const recent = await this.#ops.replayedWithoutApproval(parsed.operator, tx);
          const letters = await tx
            .select({ id: deadLetters.id })
            .from(deadLetters)
            .where(and(eq(deadLetters.status, "pending_review"), ...filterConditions(filter)))
            .orderBy(asc(deadLetters.id))
            .limit(parsed.limit ?? MAX_BATCH_LETTERS);
          if (letters.length === 0) throw new OpsError("INVALID_INPUT", "the filter selects no pending dead letter");
          // The versions its consumers report now: what the approver approves, and what it runs against (#21 item 6).
          const versions = await reportedVersions(
            tx,
            await consumersOf(
              tx,
              letters.map((l) => l.id),
            ),
          );
          // Through the database's function: the requester it records is the
          // session's role (or a trusted service's named subject).
          const row = {
            id,
            filter: jsonFilter(parsed.filter),
            reason: parsed.reason,
            rate_per_second: parsed.ratePerSecond,
            rate_share: parsed.rateShareOfLive ?? null,
            rate_floor: rateFloor,
            batch_size: parsed.batchSize,
            sample_size: parsed.sampleSize ?? null,
            max_failure_rate: parsed.maxFailureRate,
            max_duplicate_rate: parsed.maxDuplicateRate,
            max_rate_limited_multiple: parsed.maxRateLimitedMultiple,
            max_latency_multiple: parsed.maxLatencyMultiple,
            expires_at: expiresAt.toISOString(),
            created_at: now.toISOString(),
            consumer_versions: Object.keys(versions).length > 0 ? versions : null,
          };
          await tx.execute(sql`
          select core.ops_create_batch(${JSON.stringify(row)}::jsonb, ${parsed.operator},
            ${letters.length + recent > this.#policy.approvalThreshold},
            ${sql.param(letters.map((l) => l.id))}::uuid[], ${parsed.sampleSize ?? 0})`);
          // Read committed whatever the database's default: the count after the
          // quota lock must see what the other claim or batch committed meanwhile.
        },
        { isolationLevel: "read committed" },
      );
      return this.get(id);
    });
  }

  /** A second operator approves a large batch; the requester cannot approve their own. */
  async approve(id: string, input: { operator: string }): Promise<BatchView> {
    return this.#ops.audited(operatorName(input?.operator), "batch.approve", { batchId: scopeId(id) }, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const batch = await this.#load(id);
      // Case-insensitively: "Ana" approving "ana"'s batch is the requester approving it.
      if (batch.requestedBy.toLowerCase() === operator.toLowerCase()) {
        throw new OpsError(
          "FORBIDDEN",
          `${operator} requested batch ${id} and cannot approve it; another operator must`,
        );
      }
      // The database binds the approver to the session and refuses the requester too (ops_batch_approve).
      const [answer] = rowsOf<{ status: string | null }>(
        await this.#db.execute(
          sql`select core.ops_batch_approve(${id}::uuid, ${operator}, ${this.#now().toISOString()}::timestamptz) as status`,
        ),
      );
      if (answer?.status === "missing") throw new OpsError("NOT_FOUND", `no replay batch ${id}`);
      if (answer?.status) {
        throw new OpsError("CONFLICT", `batch ${id} is ${answer.status}; it must be awaiting_approval to become ready`);
      }
      return this.get(id);
    });
  }

  async pause(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: scopeId(id), reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.pause", scope, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      await this.#transition(id, ["ready", "running"], "paused", { action: "pause", operator, reason });
      return this.get(id);
    });
  }

  /**
   * Makes a paused batch runnable again. Resuming a batch its sample paused is
   * the operator's decision to go on anyway; the failure rate counts afresh from now.
   */
  async resume(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: scopeId(id), reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.resume", scope, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      // Only a sample that ran and failed is accepted by resuming (ops_batch_set
      // 'resume'); a pause for any other reason keeps the sample requirement.
      await this.#transition(id, ["paused"], "ready", { action: "resume", operator, reason });
      return this.get(id);
    });
  }

  async stop(id: string, input: { operator: string; reason: string }): Promise<BatchView> {
    const scope = { batchId: scopeId(id), reason: input?.reason };
    return this.#ops.audited(operatorName(input?.operator), "batch.stop", scope, async () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      await this.#transition(id, ["awaiting_approval", "ready", "running", "paused"], "stopped", {
        action: "stop",
        operator,
        reason,
      });
      return this.get(id);
    });
  }

  /**
   * The batch with its counts: the row's (kept by the runner), plus a
   * read-only look at up to `RESOLVE_PAGE` replayed jobs the runner has not
   * resolved yet (so a finished batch shows what became of its last jobs).
   * It writes nothing: a read-only command never changes the database.
   */
  async get(id: string): Promise<BatchView> {
    const batch = await this.#load(id);
    const live = await unresolvedNow(this.#db, id);
    return viewOf(batch, live);
  }

  /** Batches, newest first, a page at a time: pass `cursor` (the last id of a page) for the next. */
  async list(options: { status?: ReplayBatchStatus; limit?: number; cursor?: string } = {}): Promise<ReplayBatchRow[]> {
    // A misspelt status is an error, never an empty (or wider) list.
    const status =
      options?.status === undefined ? undefined : parseInput(z.enum(REPLAY_BATCH_STATUSES), options.status, "status");
    const cursor =
      options?.cursor === undefined
        ? undefined
        : parseInput(z.uuid({ error: "is not a cursor from a previous page" }), options.cursor, "cursor");
    return this.#db
      .select()
      .from(replayBatches)
      .where(
        and(status ? eq(replayBatches.status, status) : undefined, cursor ? lt(replayBatches.id, cursor) : undefined),
      )
      .orderBy(desc(replayBatches.id))
      .limit(Math.min(Math.max(options?.limit ?? 50, 1), 500));
  }

  /**
   * Runs the batch until it completes, pauses, is stopped or expires (or
   * `maxDurationMs` passes). One runner at a time: a lease on the row,
   * renewed by a heartbeat every third of `leaseMs` for as long as the run
   * lasts — through slow publishes, the pause between replays at a low rate
   * and the wait for the sample (#10 item 9) — and checked before every
   * replay together with the batch still running and unexpired, so a pause,
   * stop or expiry takes effect at the next letter and a runner that lost its
   * lease stops. A refused run, and every pause the runner makes itself
   * (interrupted, sample, failure rate, a failed or unroutable replay), is audited.
   */
  async run(id: string, options: RunOptions): Promise<BatchView> {
    const operator = operatorName(options?.operator);
    const refuse = async (error: unknown): Promise<never> => {
      await this.#ops
        .audit({
          operator,
          action: "batch.run",
          scope: { batchId: scopeId(id) },
          // Like every library refusal (#audited): a state or rule that refused it is "rejected".
          result: error instanceof OpsError ? "rejected" : "error",
          detail: error instanceof Error ? error.message : String(error),
        })
        .catch(() => {});
      throw markAudited(error); // the HTTP layer must not audit it a second time
    };
    let first: ReplayBatchRow;
    try {
      parseInput(operatorSchema, options?.operator, "operator");
      first = await this.#load(id);
      if (first.status === "awaiting_approval")
        throw new OpsError("CONFLICT", `batch ${id} awaits approval by a second operator`);
      if (first.status === "paused") {
        throw new OpsError("CONFLICT", `batch ${id} is paused (${first.stopReason ?? "no reason"}); resume it first`);
      }
    } catch (error) {
      return refuse(error);
    }
    const runner = `${operator}@${hostname()}:${process.pid}:${uuidv7().slice(-8)}`;
    const clock = this.#ops.clock;
    const startedAt = clock.now();
    let published = 0;
    // Nothing to run: said, and audited like every refusal (#21 item 6).
    const nothingToRun = async (detail: string) =>
      this.#ops
        .audit({ operator, action: "batch.run", scope: { batchId: scopeId(id) }, result: "rejected", detail })
        .catch(() => {});
    if (TERMINAL.includes(first.status)) {
      await nothingToRun(`batch ${id} is ${first.status}; nothing to run`);
      return this.get(id);
    }
    if (first.expiresAt.getTime() <= startedAt) {
      await nothingToRun(
        `batch ${id} expired at ${first.expiresAt.toISOString()} before it finished; it is now expired`,
      );
      return this.#finish(id, "expired", "expired before it finished", operator);
    }
    // Never against consumers other than those it was made and approved for (#21 item 6).
    const changed = await versionMoved(this.#db, first).catch(
      (error: unknown) => `their versions could not be read: ${describeError(error)}`,
    );
    if (changed) {
      return refuse(
        new OpsError(
          "CONFLICT",
          `batch ${id} cannot run: ${changed}; create a new batch for the consumers running now`,
        ),
      );
    }
    /** After this clock time the run claims nothing more (`maxDurationMs`, #21 item 2). */
    const deadline = options.maxDurationMs !== undefined ? startedAt + Math.max(0, options.maxDurationMs) : null;

    // Taken under the batch's lock: a takeover waits for the claims of the runner it replaces.
    const leased = await this.#set(id, "lease", {
      operator,
      runner,
      leaseMs: this.#policy.leaseMs,
    });
    if (!leased) {
      const now = await this.#load(id);
      return refuse(
        new OpsError(
          "CONFLICT",
          now.leaseOwner
            ? `batch ${id} is being run by another runner (${now.leaseOwner})`
            : `batch ${id} is being run by another runner (or changed state: it is ${now.status})`,
        ),
      );
    }
    await this.#ops.audit({
      operator,
      action: "batch.run",
      scope: { batchId: scopeId(id) },
      result: "ok",
      detail: `runner ${runner}`,
    });

    const renewLease = () => this.#set(id, "renew", { operator, runner, leaseMs: this.#policy.leaseMs });
    // The heartbeat: a wait longer than the lease (a slow publish, a rate
    // below one per lease) must not let a second runner take over mid-letter.
    let beat: Promise<unknown> | undefined;
    const heartbeat = setInterval(
      () => {
        if (beat) return; // one renewal at a time
        beat = renewLease()
          .catch(() => {}) // the next beat tries again; stillMine() decides
          .finally(() => {
            beat = undefined;
          });
      },
      Math.max(10, this.#policy.leaseMs / 3),
    );
    heartbeat.unref();

    /** Renews the lease if this runner still holds a running, unexpired batch; false means stop. */
    const stillMine = () => this.#set(id, "renew_unexpired", { operator, runner, leaseMs: this.#policy.leaseMs });
    /** Pauses the batch (or returns it to approval) if this runner still runs it, and audits the pause as an action. */
    const pauseIfRunning = async (stopReason: string, cause: string) => {
      const paused = await this.#set(id, cause === "needs_approval" ? "await_approval" : "pause_running", {
        operator,
        runner,
        reason: stopReason,
      });
      if (paused) {
        await this.#ops.audit({
          operator,
          action: "batch.pause",
          scope: { batchId: scopeId(id), automatic: cause !== "interrupted", cause },
          result: "ok",
          detail: stopReason,
        });
      }
    };

    // Paced by a share of live traffic: measured now and again at every chunk.
    const pacedByShare = first.rateShare !== null && first.rateFloor !== null;
    const strain = this.#ops.strain;
    const consumers = pacedByShare || strain ? await batchConsumers(this.#db, id) : [];
    // The baseline of dependency strain: the consumers' live traffic before the batch (#21 item 5).
    const baseline = await strainBaseline(strain, consumers, startedAt);
    const pace = async (): Promise<number> => {
      if (!pacedByShare) return first.ratePerSecond;
      const live = await liveRatePerSecond(this.#db, consumers);
      return pacedRate(first.rateShare as number, live, first.rateFloor as number, first.ratePerSecond);
    };
    let pacedPerSecond = await pace();
    let intervalMs = 1000 / pacedPerSecond;
    // The next replay's earliest time, on a fixed schedule: a runner that fell
    // behind by its own bookkeeping (a chunk's queries, at most CATCH_UP_MS)
    // catches up, so the batch keeps its rate on average; waiting (for a
    // sample) earns no credit, so the batch never bursts after it.
    let nextDue = startedAt + intervalMs;
    const progress = async () => {
      if (!options.onProgress) return;
      const batch = await this.get(id);
      const elapsed = Math.max(1, clock.now() - startedAt) / 1000;
      options.onProgress({
        batch,
        rate: published / elapsed,
        etaSeconds: batch.pending / pacedPerSecond,
        pacedPerSecond,
      });
    };

    /** What the latest check of the lease said (the lease was just taken: this runner's). */
    let lastMine = true;
    /** Why the runner must pause (a failed or unroutable replay, the failure rate, the two-person rule), once something said so. */
    let stopped: { reason: string; cause: string } | undefined;
    /** Why a claim was refused by the batch's state, expiry or this run's deadline: the run ends. */
    let halted: BatchHalt | undefined;
    /**
     * The stop conditions run beside the replays, one check at a time, not
     * between them: their cost (bounded, RESOLVE_PAGE jobs) never stretches
     * the interval between two replays. What they find takes effect at the
     * next letter.
     */
    let checking: Promise<void> | undefined;
    const check = async (maxFailureRate: number, inSample: boolean) => {
      // Bounded: at most RESOLVE_PAGE replayed jobs are looked at, each once
      // resolved; the counts on the row grow with what this step found.
      const resolved = await resolveReplayed(this.#db, id, this.#now());
      if (resolved.failedAgain > 0) this.#ops.metrics.failedAgain(resolved.failedAgain);
      const window = await this.#load(id);
      const windowResolved = window.windowSucceeded + window.windowFailedAgain + window.windowDuplicates;
      if (
        !inSample &&
        windowResolved >= this.#policy.minResolvedForRate &&
        window.windowDuplicates / windowResolved > window.maxDuplicateRate
      ) {
        const rate = Math.round((window.windowDuplicates / windowResolved) * 100);
        stopped ??= {
          reason: `duplicate rate ${rate}% (${window.windowDuplicates} of ${windowResolved} resolved replays found their job already done) is over ${Math.round(window.maxDuplicateRate * 100)}%: the selection is wrong, or a fix already ran`,
          cause: "duplicate_rate",
        };
      }
      if (
        !inSample &&
        windowResolved >= this.#policy.minResolvedForRate &&
        window.windowFailedAgain / windowResolved > maxFailureRate
      ) {
        const rate = Math.round((window.windowFailedAgain / windowResolved) * 100);
        stopped ??= {
          reason: `failure rate ${rate}% (${window.windowFailedAgain} of ${windowResolved} resolved replays failed again) is over ${Math.round(maxFailureRate * 100)}%`,
          cause: "failure_rate",
        };
      }
    };
    const settleCheck = async () => {
      await checking?.catch(() => {}); // a failed check is retried after the next chunk
    };

    // Replays START at the batch's rate; each runs on its own (at most
    // `maxInFlight` at once), so a slow publish or database round trip does
    // not slow the rate down: it is limited by the pacing.
    const inFlight = new Map<string, Promise<void>>();
    const drain = () => Promise.all(inFlight.values());
    const replay = async (deadLetterId: string) => {
      const result = await this.#ops.replayOne(deadLetterId, {
        operator,
        reason: `batch ${id}: ${first.reason}`,
        batchId: id,
        guard: { runner, deadline },
      });
      if (result.outcome === "halted" && result.halt) {
        // The claim's own transaction said no (#21 items 1, 2, 4): the letter stays pending.
        if (result.halt.cause === "needs_approval") stopped ??= { reason: result.halt.reason, cause: "needs_approval" };
        else halted ??= result.halt;
        return;
      }
      if (result.outcome === "failed" || result.outcome === "not_routable") {
        // The letter stays pending; the operator decides (fix the route or the transport, then resume).
        stopped ??= {
          reason: `${result.outcome === "failed" ? "replay failed" : "replay not routable"}: ${result.detail}`,
          cause: result.outcome === "failed" ? "replay_failed" : "not_routable",
        };
        return;
      }
      published += 1;
      // A letter this batch already replayed (an earlier runner of it) counts as replayed.
      const replayed =
        result.outcome === "replayed" || (result.outcome === "not_pending" && result.replayBatchId === id);
      await recordItem(this.#db, id, deadLetterId, replayed ? "replayed" : "skipped", this.#now());
    };

    try {
      // Every state change below is awaited before its return (`return await`):
      // a promise returned unawaited lets the finally block run first, and its
      // recovery report read the batch as still running.
      for (;;) {
        if (halted && !stopped) {
          await drain();
          if (halted.cause === "expired") return await this.#finish(id, "expired", halted.reason, operator);
          return this.get(id);
        }
        if (stopped) {
          await drain();
          await settleCheck();
          await pauseIfRunning(stopped.reason, stopped.cause);
          return this.get(id);
        }
        const batch = await this.#load(id);
        if (batch.status !== "running" || batch.leaseOwner !== runner) {
          await drain();
          return this.get(id);
        }
        // Expired by this runner's clock or by the database's (a lagging clock
        // must not run a batch past its expiresAt: the claims refuse it then).
        if (batch.expiresAt.getTime() <= clock.now() || (await expiredForDatabase(this.#db, id))) {
          await drain();
          return await this.#finish(id, "expired", "expired before it finished", operator);
        }
        if (options.signal?.aborted) {
          await drain();
          await pauseIfRunning(`interrupted: runner of ${operator} was stopped`, "interrupted");
          return this.get(id);
        }
        if (deadline !== null && clock.now() >= deadline) {
          await drain();
          return this.get(id);
        }

        const inSample = Boolean(batch.sampleSize) && !batch.samplePassedAt;
        // Letters in flight are still pending until recorded: asked for and left out.
        const items = (
          await this.#db
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
            .limit(batch.batchSize + inFlight.size)
        ).filter((item) => !inFlight.has(item.deadLetterId));

        if (items.length === 0 && inFlight.size > 0) {
          await drain(); // then look again: the sample gate and completion need every replay recorded
          continue;
        }
        if (inSample && items.length === 0) {
          const verdict = await awaitSample(this.#ops, this.#policy, id, stillMine, options.signal);
          if (verdict === "lost") continue; // paused, stopped, expired or taken over: the top of the loop says which
          if (verdict !== "passed") {
            await pauseIfRunning(verdict, verdict.startsWith("sample:") ? "sample" : "interrupted");
            return this.get(id);
          }
          // Its outcomes beside the selection's classes, for a person to say go on (#21 item 7).
          const review = await reviewSample(this.#db, id, options.confirmSample);
          if (review) {
            await pauseIfRunning(review, "sample_review");
            return this.get(id);
          }
          await this.#set(id, "sample_passed", { operator, runner });
          nextDue = clock.now() + intervalMs; // the wait earned nothing
          continue;
        }
        if (items.length === 0) {
          // The last check decides first: a failure rate it found still pauses the batch.
          await settleCheck();
          if (stopped) continue;
          return await this.#finish(id, "completed", null, operator);
        }

        for (const item of items.slice(0, batch.batchSize)) {
          // The check that the batch is still this runner's, running and
          // unexpired goes out while the runner waits for the letter's turn
          // (its round trip overlaps the interval), and the letter starts
          // only once it said yes: a pause, stop or expiry takes effect at
          // the next letter.
          // A letter whose turn comes after this run's deadline is the next run's.
          if (deadline !== null && nextDue >= deadline) {
            halted ??= { cause: "deadline", reason: "this run's maxDurationMs is over" };
            break;
          }
          const mine = stillMine().catch(() => false);
          const wait = nextDue - clock.now();
          if (wait > 0) await sleep(wait, options.signal);
          lastMine = await mine;
          // The claim itself checks the batch again, after this wait (replayOne's guard).
          if (!lastMine || stopped || halted || options.signal?.aborted) break;
          nextDue = Math.max(nextDue, clock.now() - CATCH_UP_MS) + intervalMs;
          const running = replay(item.deadLetterId)
            .catch((error: unknown) => {
              // Recording the replay failed (the database): stop here, the operator resumes.
              stopped ??= { reason: `replay failed: ${describeError(error)}`, cause: "replay_failed" };
            })
            .finally(() => inFlight.delete(item.deadLetterId));
          inFlight.set(item.deadLetterId, running);
          if (inFlight.size >= this.#policy.maxInFlight) await Promise.race(inFlight.values());
        }
        // The chunk's replays are recorded before it reports progress (a late
        // one's wait is caught up afterwards: CATCH_UP_MS).
        await drain();
        if (stopped || halted || !lastMine) continue; // the top of the loop pauses, ends, or sees the batch is no longer ours
        if (pacedByShare) {
          // A failed measurement keeps the last pace; the next chunk measures again.
          pacedPerSecond = await pace().catch(() => pacedPerSecond);
          intervalMs = 1000 / pacedPerSecond;
        }
        await progress();
        // A deploy, or a dependency straining under the batch: the rest waits for a person.
        const guard = { db: this.#db, batch, strain, baseline, consumers, startedAt, now: clock.now() };
        const stop = await stopBetweenChunks(guard);
        if (stop) {
          stopped ??= stop;
          continue;
        }
        checking ??= check(batch.maxFailureRate, inSample).finally(() => {
          checking = undefined;
        });
      }
    } finally {
      await drain();
      await settleCheck();
      clearInterval(heartbeat);
      await beat;
      await this.#set(id, "release", { operator, runner });
      await progress().catch(() => {});
      // The recovery report as a metric (#21 item 7); a failed read reports nothing.
      const report = this.#ops.metrics.batchRecovery ? await this.get(id).catch(() => undefined) : undefined;
      if (report) this.#ops.metrics.batchRecovery?.(recoveryOf(report));
    }
  }

  async #load(id: string): Promise<ReplayBatchRow> {
    const batchId = parseInput(z.uuid({ error: "must be a batch id (UUID)" }), id, "batch id");
    const [batch] = await this.#db.select().from(replayBatches).where(eq(replayBatches.id, batchId));
    if (!batch) throw new OpsError("NOT_FOUND", `no replay batch ${id}`);
    return batch;
  }

  /**
   * A conditional state change by an operator (pause, resume, stop): it
   * happens only from one of `from`, else CONFLICT saying the current state.
   * The database function takes the batch's lock, so a pause or stop waits
   * for the claims in flight and no claim after it can miss it (#21 item 1).
   */
  async #transition(
    id: string,
    from: ReplayBatchStatus[],
    to: ReplayBatchStatus,
    change: { action: "pause" | "resume" | "stop"; operator: string; reason: string },
  ) {
    // Validated before the query: a malformed id is bad input (400, exit 2), never a database error.
    parseInput(z.uuid({ error: "must be a batch id (UUID)" }), id, "batch id");
    if (!(await this.#set(id, change.action, change))) {
      const batch = await this.#load(id);
      throw new OpsError("CONFLICT", `batch ${id} is ${batch.status}; it must be ${from.join(" or ")} to become ${to}`);
    }
  }

  /**
   * One change of a batch's state, lease or progress through the database's
   * function (ops_batch_set): operators have no UPDATE on the table, and the
   * function records the session's role as who. True when the row changed.
   */
  async #set(
    id: string,
    action: BatchAction,
    fields: { operator: string; reason?: string | null; runner?: string; leaseMs?: number },
  ): Promise<boolean> {
    const [row] = rowsOf<{ changed: boolean }>(
      await this.#db.execute(sql`
        select core.ops_batch_set(${id}::uuid, ${action}, ${fields.operator}, ${fields.reason ?? null},
          ${fields.runner ?? null}, ${this.#now().toISOString()}::timestamptz,
          ${fields.leaseMs === undefined ? null : Math.ceil(fields.leaseMs)}::integer) as changed`),
    );
    return row?.changed === true;
  }

  async #finish(
    id: string,
    status: "completed" | "expired",
    reason: string | null,
    operator: string,
  ): Promise<BatchView> {
    await this.#set(id, status === "completed" ? "complete" : "expire", { operator, reason });
    return this.get(id);
  }
}
