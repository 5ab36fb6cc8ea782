/**
 * The replay claim path (moved out of operations.ts): how one letter is
 * claimed and republished (`replayOne`), what a batch runner's claim is
 * checked against in its own transaction, and the two-person rule's count and
 * locks. `DeadLetterOperations` delegates its public methods here.
 */
import { eq, sql } from "drizzle-orm";
import { deadLetters } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { describeError, isSoftcrumError } from "../errors.ts";
import { isStored } from "../queue-port.ts";
import { withinMs } from "../timers.ts";
import type { DeadLetterOperations } from "./operations.ts";
import { decodePayload, formatWindow, notPendingDetail, rowsOf } from "./ops-helpers.ts";
import type { ActionOutcome } from "./ops-types.ts";

/** What the claim path reads of the operations: its database, clock, rule and transport. */
type ClaimOps = Pick<
  DeadLetterOperations,
  "db" | "clock" | "approvalThreshold" | "approvalWindowMs" | "replayTransport" | "publishTimeoutMs" | "metrics"
>;

/** What a batch runner's claim is checked against (`replayOne`'s `guard`). */
export interface BatchClaimGuard {
  /** The runner that must hold the batch's lease. */
  readonly runner: string;
  /** The clock time (ms) after which this run claims nothing (its `maxDurationMs`); null for none. */
  readonly deadline: number | null;
}

/** Why a batch's claim was refused: its state, its expiry, the run's deadline, or the two-person rule. */
export interface BatchHalt {
  readonly cause: "state" | "expired" | "deadline" | "needs_approval";
  readonly reason: string;
}

/** What `replayOne` is asked: who, why, for which batch (null: a direct replay), and a batch runner's guard. */
export interface ReplayOneInput {
  operator: string;
  reason: string;
  batchId: string | null;
  guard?: BatchClaimGuard;
  /**
   * Replay again a letter that is `replayed` but whose replay never ran (no
   * fence, no newer letter: the copy was lost), instead of a pending one (#21 item 4).
   */
  again?: boolean;
}

/** What `replayOne` did with the letter. */
export interface ReplayOneResult {
  outcome: ActionOutcome | "halted";
  detail?: string;
  replayBatchId?: string | null;
  halt?: BatchHalt;
}

/** The longest a replay batch may live (`expiresAt`): 30 days. */
export const MAX_BATCH_LIFETIME_MS = 30 * 86_400_000;

/**
 * What `operator` replayed without a second operator over the approval
 * window (`approvalWindowMs`): letters they replayed directly, and the
 * letters of batches they requested that nobody approved (what a finished
 * batch replayed; what one still to run selected). Index scans
 * (dead_letters_direct_replays_idx, replay_batches_requester_idx).
 *
 * Every caller only compares the count with `approvalThreshold`, so each
 * part stops counting at the threshold: a claim reads at most that many
 * rows, not every replay of the window (a trusted service with a threshold
 * of 100,000 recounted its whole batch at every claim, and a batch's rate
 * fell to a few letters a second). A threshold no count can reach
 * (Number.MAX_SAFE_INTEGER or more: the library's rule off, the
 * database's ceiling still holding for logins it does not trust) counts nothing.
 */
export async function replayedWithoutApproval(
  ops: ClaimOps,
  operator: string,
  db: Pick<AnyPgDatabase, "execute"> = ops.db,
  count: "published" | "published_and_queued" = "published_and_queued",
): Promise<number> {
  if (ops.approvalThreshold >= Number.MAX_SAFE_INTEGER) return 0;
  const cap = Math.max(Math.ceil(ops.approvalThreshold), 0);
  const since = new Date(ops.clock.now() - ops.approvalWindowMs).toISOString();
  // Replays count when they happen (#21 item 4), whenever their batch was
  // made: a batch lives up to MAX_BATCH_LIFETIME, so its letters are looked
  // for among the batches made that long before the window.
  const batchesSince = new Date(ops.clock.now() - ops.approvalWindowMs - MAX_BATCH_LIFETIME_MS).toISOString();
  const queued =
    count === "published"
      ? sql`0`
      : sql`(select coalesce(sum(greatest(selected - replayed - skipped, 0)), 0)::int
            from core.replay_batches
            where requested_by = ${operator} and approved_by is null
              and status in ('ready', 'running', 'paused'))`;
  const result = await db.execute(sql`
    select (select count(*)::int from (select from core.dead_letters
            where status = 'replayed' and replay_batch_id is null
              and status_changed_by = ${operator} and status_changed_at >= ${since}::timestamptz
            limit ${cap}) as direct)
         + (select count(*)::int from (select
            from core.replay_batches b
            join core.dead_letters d on d.replay_batch_id = b.id and d.status = 'replayed'
            where b.requested_by = ${operator} and b.approved_by is null
              and b.created_at >= ${batchesSince}::timestamptz
              and d.status_changed_at >= ${since}::timestamptz
            limit ${cap}) as batched)
         + ${queued} as n`);
  return rowsOf<{ n: number }>(result)[0]?.n ?? 0;
}

/**
 * Serialises, until `tx` ends, everything that counts against one
 * requester's approval threshold (direct replays, batch creation): a count
 * taken after this lock sees every earlier claim of that requester
 * committed, so two sessions cannot both pass the threshold by counting at
 * once. A two-key advisory lock: its key space is apart from the harness's
 * ordering locks (one bigint key).
 */
/**
 * A batch's control lock, until `tx` ends: claims of its letters hold it
 * shared, changes of its state or runner exclusively (#21 item 1).
 */
export async function lockBatch(
  tx: Pick<AnyPgDatabase, "execute">,
  batchId: string,
  mode: "shared" | "exclusive",
): Promise<void> {
  await tx.execute(
    mode === "shared"
      ? sql`select pg_advisory_xact_lock_shared(hashtext('softcrum.ops.batch'), hashtext(${batchId}::uuid::text))`
      : sql`select pg_advisory_xact_lock(hashtext('softcrum.ops.batch'), hashtext(${batchId}::uuid::text))`,
  );
}

export async function lockReplayQuota(tx: Pick<AnyPgDatabase, "execute">, operator: string): Promise<void> {
  await tx.execute(sql`select pg_advisory_xact_lock(hashtext('softcrum.ops.replay-quota'), hashtext(${operator}))`);
}

/**
 * Whether a batch's runner may claim a letter now, asked in the claim's own
 * transaction, after the wait for the letter's turn (#21 item 1): the batch
 * is still running, this runner's, unexpired, inside the run's
 * `maxDurationMs`, and — unapproved — its requester's replays over the
 * approval window leave room for one more. The claim holds the batch's
 * lock shared (`lockBatch`) until it commits: a pause, stop or takeover
 * takes it exclusively, so it waits for the claims in flight and every
 * later claim sees it. (A row lock would also hold up the lease's
 * heartbeat for as long as a publish takes.) Undefined: it may.
 */
async function batchMayClaim(
  ops: ClaimOps,
  tx: Pick<AnyPgDatabase, "execute">,
  batchId: string,
  guard: BatchClaimGuard,
): Promise<BatchHalt | undefined> {
  await lockBatch(tx, batchId, "shared");
  const [batch] = rowsOf<{
    status: string;
    lease_owner: string | null;
    expires_at: string | Date;
    expired: boolean;
    approved_by: string | null;
    requested_by: string;
  }>(
    // Expired by the database's clock too: a runner whose clock lags would
    // otherwise run a batch past its expiresAt (leases are the database's
    // time for the same reason, migration 0023).
    await tx.execute(sql`
      select status, lease_owner, expires_at, expires_at <= now() as expired, approved_by, requested_by
      from core.replay_batches where id = ${batchId}`),
  );
  const now = ops.clock.now();
  if (!batch) return { cause: "state", reason: `batch ${batchId} no longer exists` };
  if (batch.status !== "running") return { cause: "state", reason: `batch is ${batch.status}` };
  if (batch.lease_owner !== guard.runner) return { cause: "state", reason: "another runner took the batch over" };
  if (batch.expired || new Date(batch.expires_at).getTime() <= now) {
    return { cause: "expired", reason: "expired before it finished" };
  }
  if (guard.deadline !== null && now >= guard.deadline) {
    return { cause: "deadline", reason: "this run's maxDurationMs is over" };
  }
  if (batch.approved_by === null) {
    await lockReplayQuota(tx, batch.requested_by);
    const recent = await replayedWithoutApproval(ops, batch.requested_by, tx, "published");
    if (recent >= ops.approvalThreshold) {
      return {
        cause: "needs_approval",
        reason: `needs approval: ${batch.requested_by} replayed ${recent} letters without a second operator's approval in the last ${formatWindow(ops.approvalWindowMs)}, the approval threshold of ${ops.approvalThreshold}; another operator must approve the rest of this batch`,
      };
    }
  }
  return undefined;
}

/**
 * Whether the letter is `replayed` from before its consumer's fence horizon
 * (`core.fence_horizons`): the cleanup may have deleted the fence its replay
 * wrote, so no fence no longer says the replay never ran (migration 0032).
 */
async function pastFenceHorizon(ops: ClaimOps, id: string): Promise<boolean> {
  const [row] = rowsOf<{ past: boolean }>(
    await ops.db.execute(sql`
      select exists (select 1 from core.dead_letters d join core.fence_horizons h on h.consumer = d.consumer
                     where d.id = ${id}::uuid and d.status = 'replayed' and d.status_changed_at < h.cleaned_before) as past`),
  );
  return row?.past === true;
}

/**
 * Republishes one letter's original envelope (same job_id, no dedup key)
 * and marks it `replayed`. The status change is conditional and held in the
 * same transaction as the publish: of two operators replaying the same
 * letter, one publishes and the other finds it no longer pending; if the
 * publish fails, the letter stays pending. Not audited on its own: callers are.
 */
export async function replayOne(ops: ClaimOps, id: string, input: ReplayOneInput): Promise<ReplayOneResult> {
  const [row] = await ops.db
    .select({
      status: deadLetters.status,
      statusChangedBy: deadLetters.statusChangedBy,
      queue: deadLetters.queue,
      consumer: deadLetters.consumer,
      payload: deadLetters.payload,
      payloadEncoding: deadLetters.payloadEncoding,
      replayBatchId: deadLetters.replayBatchId,
    })
    .from(deadLetters)
    .where(eq(deadLetters.id, id));
  if (!row) return { outcome: "not_found" };
  if (input.again === true && row.status !== "replayed") {
    return {
      outcome: "not_pending",
      detail: `${notPendingDetail(row)}: only a replayed letter whose replay never ran is replayed again`,
      replayBatchId: row.replayBatchId,
    };
  }
  if (input.again !== true && row.status !== "pending_review") {
    return { outcome: "not_pending", detail: notPendingDetail(row), replayBatchId: row.replayBatchId };
  }
  const { envelope, problem } = decodePayload(row);
  if (!envelope) {
    return {
      outcome: "not_replayable",
      detail: `${problem}; it can never succeed — discard it and fix the producer`,
    };
  }
  // Refused before anything changes: a replay nobody would read is not "done".
  const route = ops.replayTransport.route(row.queue, row.consumer);
  if (!route.ok) {
    return {
      outcome: "not_routable",
      detail: `cannot route a replay to consumer "${row.consumer}" of queue "${row.queue}": ${route.reason}; the letter stays pending`,
    };
  }
  // The bytes exactly as received (unknown fields, the job_id's case): only
  // decoded from base64 where Postgres text could not hold them.
  const body = row.payloadEncoding === "base64" ? new Uint8Array(Buffer.from(row.payload, "base64")) : row.payload;
  let published = false;
  // An in-process transport runs the consumer here and says what became of
  // it. The consumer's fence check waits while the letter is being claimed,
  // so such a replay goes out once the claim committed, and one not applied
  // puts the letter back (#21 item 4).
  const deliver = ops.replayTransport.deliverReplay?.bind(ops.replayTransport);
  try {
    return await ops.db
      .transaction(
        async (tx) => {
          if (input.batchId === null) {
            // A direct replay: the two-person rule, checked where it cannot race.
            await lockReplayQuota(tx, input.operator);
            const recent = await replayedWithoutApproval(ops, input.operator, tx);
            if (recent >= ops.approvalThreshold) return { outcome: "needs_approval" as const, recent };
          } else if (input.guard !== undefined) {
            const halt = await batchMayClaim(ops, tx, input.batchId, input.guard);
            if (halt !== undefined) return { outcome: "halted" as const, halt };
          }
          // Through the database's function: it records the session's role (or
          // a trusted service's named subject) as who replayed, and claims a
          // batch's letter only while that batch runs under this runner.
          const [claimed] = rowsOf<{ queue: string; consumer: string }>(
            await tx.execute(
              input.again === true
                ? sql`select queue, consumer from core.ops_reclaim_letter(${id}::uuid, ${input.operator}, ${input.reason})`
                : sql`
            select queue, consumer from core.ops_claim_letter(${id}::uuid, ${input.operator}, ${input.reason},
              ${input.batchId}::uuid, ${input.guard?.runner ?? null})`,
            ),
          );
          if (!claimed) return { outcome: "lost" as const };
          if (deliver) return { outcome: "claimed" as const, claimed };
          // Only to the letter's consumer, on its replay lane: the queue's other
          // consumers either have their fence already or had their own letter
          // for this job handled separately (perhaps discarded on purpose).
          // Delivered as a replay: an operator asked for it, so it is not expired (maxAgeMs).
          // No answer in time is no answer: not stored (rolled back below).
          const receipt = await withinMs(
            ops.replayTransport.publishReplay(claimed.queue, claimed.consumer, body),
            ops.publishTimeoutMs,
            () =>
              new Error(
                `the transport did not answer the replay's publish within ${ops.publishTimeoutMs} ms; replay it again`,
              ),
          );
          // Only a copy the transport says it stored makes the letter
          // `replayed`. A 202 ("accepted for deferred processing": stored
          // later, or never) rolls this back: the letter stays pending, and a
          // copy stored after all finds it pending at its fence and does not run.
          if (!isStored(receipt)) {
            throw new Error(
              "the transport accepted the replay without confirming it is stored (a Vercel 202); replay it again",
            );
          }
          published = true;
          ops.metrics.replayed(claimed);
          return { outcome: "replayed" as const };
          // Read committed whatever the database's default: the batch's and the
          // quota's locks are waited for inside, and what is read after them
          // must be what the pause, the stop or the other claim committed (a
          // snapshot from before the wait let a claim run after a pause
          // returned, and two claims pass the approval threshold).
        },
        { isolationLevel: "read committed" },
      )
      .then(async (result) => {
        if (result.outcome === "claimed") {
          if (!deliver) throw new Error("claimed for an in-process delivery without one");
          const { claimed } = result;
          try {
            await withinMs(
              deliver(claimed.queue, claimed.consumer, body, { timeoutMs: ops.publishTimeoutMs }),
              ops.publishTimeoutMs + 1_000,
              () => new Error(`the in-process replay did not answer within ${ops.publishTimeoutMs} ms`),
            );
          } catch (error) {
            const back = await unclaim(ops, id, input.operator).catch((e: unknown) => e);
            return {
              outcome: "failed" as const,
              detail:
                back === true
                  ? `not applied, the letter stays pending: ${describeError(error)}`
                  : back === false
                    ? `not confirmed, but the job's fence exists now (it was applied after all), so the letter stays replayed: ${describeError(error)}`
                    : `not applied (${describeError(error)}), and putting the letter back failed, so it says replayed: ${describeError(back)}; replay it again (dlq replay-again)`,
            };
          }
          published = true;
          ops.metrics.replayed(claimed);
          return { outcome: "replayed" as const };
        }
        if (result.outcome === "halted")
          return { outcome: "halted" as const, detail: result.halt.reason, halt: result.halt };
        if (result.outcome === "needs_approval") {
          return {
            outcome: "needs_approval" as const,
            detail: `${input.operator} replayed ${result.recent} letters without a second operator's approval in the last ${formatWindow(ops.approvalWindowMs)}, the approval threshold of ${ops.approvalThreshold}: replay it in an approved batch`,
          };
        }
        if (result.outcome !== "lost") return result;
        if (input.again === true) {
          return {
            outcome: "not_pending" as const,
            detail: (await pastFenceHorizon(ops, id))
              ? "its replay is older than the fence cleanup's horizon for its consumer (fences written before it may be deleted), so whether it ran cannot be known: it is not replayed again; look for its effect, and if there is none publish the job again yourself"
              : "its replay ran: the job has a fence or a newer letter (look at failed-after-replay), or it changed meanwhile",
            replayBatchId: row.replayBatchId,
          };
        }
        // Lost the race: say who won, so a batch runner counts a letter its own
        // batch replayed (an earlier runner) as replayed, not skipped.
        const [now] = await ops.db
          .select({
            status: deadLetters.status,
            replayBatchId: deadLetters.replayBatchId,
            statusChangedBy: deadLetters.statusChangedBy,
          })
          .from(deadLetters)
          .where(eq(deadLetters.id, id));
        return {
          outcome: "not_pending" as const,
          detail: `${now ? notPendingDetail(now) : "deleted"} (meanwhile, by someone else)`,
          replayBatchId: now?.replayBatchId ?? null,
        };
      });
  } catch (error) {
    if (isSoftcrumError(error, "NOT_ROUTABLE")) return { outcome: "not_routable", detail: error.message };
    const detail = published
      ? `published, but recording the replay failed, so the letter stays pending (replaying it again is harmless): ${describeError(error)}`
      : `publish failed, the letter stays pending: ${describeError(error)}`;
    return { outcome: "failed", detail };
  }
}

/**
 * Puts a letter this replay claimed back to `pending_review` unless the
 * job's fence exists by then (core.ops_unclaim_letter, migration 0020). Read
 * committed whatever the database's default: its fence probe must wait for a
 * delivery still committing, not fail on it. True when pending again.
 */
async function unclaim(ops: ClaimOps, id: string, operator: string): Promise<boolean> {
  return ops.db.transaction(
    async (tx) => {
      const [row] = rowsOf<{ back: boolean }>(
        await tx.execute(sql`select core.ops_unclaim_letter(${id}::uuid, ${operator}) as back`),
      );
      return row?.back === true;
    },
    { isolationLevel: "read committed" },
  );
}
