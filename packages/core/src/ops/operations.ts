/**
 * Operator actions on dead letters: find, read, discard with a reason, and
 * replay — single letters or rate-limited batches (see batches.ts). Every
 * mutating call is audited in `core.ops_audit`. Replay republishes the
 * ORIGINAL envelope with the SAME job_id — the letter's bytes exactly as
 * received — so the fence makes a job that had already committed a no-op; it
 * never passes a transport de-duplication key. Replays go through a
 * `ReplayTransport` (routes.ts) onto the consumer's replay lane; a letter it
 * cannot route is refused and stays pending.
 */
import { and, asc, desc, eq, getTableColumns, gt, gte, inArray, lt, type SQL, sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { z } from "zod";
import { type Clock, systemClock } from "../clock.ts";
import { type DeadLetterRow, deadLetterPayloads, deadLetters, opsAudit } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { checkEnvelope, type Envelope } from "../envelope.ts";
import { describeError, InvalidConfigError, isSoftcrumError, OpsError } from "../errors.ts";
import { isStored, type QueuePort, type ReplayLanePort } from "../queue-port.ts";
import { withinMs } from "../timers.ts";
import {
  type DeadLetterFilter,
  deadLetterFilterSchema,
  idListSchema,
  operatorSchema,
  type ParsedFilter,
  parseInput,
  reasonSchema,
} from "./filters.ts";
import { markAudited } from "./refusals.ts";
import { type ReplayRoute, type ReplayTransport, replayTransportFor } from "./routes.ts";

/** Where replay and failed-again counts go (OpenTelemetry in production). */
export interface OpsMetricsPort {
  /** One letter republished. */
  replayed(attributes: { readonly queue: string; readonly consumer: string }): void;
  /** Jobs replayed by a batch that failed again, as the batch runner finds them. */
  failedAgain(count: number): void;
}
export const noopOpsMetrics: OpsMetricsPort = { replayed() {}, failedAgain() {} };

export interface OpsDeps {
  readonly db: AnyPgDatabase;
  /**
   * Where replays are published: the platform transport with the routes it
   * delivers (see routes.ts). Give this, or `queue`.
   */
  readonly replay?: ReplayTransport;
  /**
   * A queue adapter to publish replays through, on its replay lane: the
   * in-process adapter routes to the consumers subscribed to it; any other
   * needs `routes`. Ignored when `replay` is given.
   */
  readonly queue?: QueuePort & Partial<ReplayLanePort>;
  /** With `queue`: the registry of routes modules contributed. @default what an in-process queue has subscribed; none otherwise */
  readonly routes?: readonly ReplayRoute[];
  /**
   * Most letters one requester may replay without a second operator's
   * approval over `approvalWindowMs`: direct replays and unapproved batches
   * together (SPEC §5). @default 100
   */
  readonly approvalThreshold?: number;
  /** The rolling window of `approvalThreshold`. @default 86_400_000 (24 h) */
  readonly approvalWindowMs?: number;
  /** @default no metrics */
  readonly metrics?: OpsMetricsPort;
  /** @default the system clock */
  readonly clock?: Clock;
  /** Most letters one direct `replay()` call may take; more need a batch. @default 100 */
  readonly maxDirectReplay?: number;
  /**
   * Longest one replay's publish may take (the letter's row is locked while
   * it runs): no answer in time is not stored, the replay rolls back and the
   * letter stays pending (a copy stored after all finds it pending and does
   * not run). @default 10_000
   */
  readonly publishTimeoutMs?: number;
}

export type DeadLetterSummary = Omit<DeadLetterRow, "payload">;

export interface Page<T> {
  readonly items: T[];
  /** Pass back as `cursor` for the next page; null on the last one. */
  readonly nextCursor: string | null;
}

export interface DeadLetterDetail extends DeadLetterRow {
  /** The payload decoded as text (base64 payloads decoded), and as an envelope when it is one. */
  readonly payloadText: string;
  readonly envelope: Envelope | null;
  /** Other dead letters of the same job and consumer: earlier failures and failures after replays. */
  readonly related: DeadLetterSummary[];
  /**
   * Copies of this job that arrived with other bytes than `payload` while the
   * letter was pending (`core.dead_letter_payloads`), first seen first: each
   * distinct payload's evidence, exactly as received.
   */
  readonly otherPayloads: OtherPayload[];
  /** Audit entries that name this letter or its batch, oldest first: the first `HISTORY_IN_DETAIL` of them. */
  readonly history: AuditEntry[];
  /** Pass to `history(id, { cursor })` for the entries after these; null when these are all. */
  readonly historyNextCursor: string | null;
}

/** One other payload of a letter (`core.dead_letter_payloads`). */
export interface OtherPayload {
  readonly payloadSha256: string;
  readonly payload: string;
  readonly payloadEncoding: string;
  /** The payload decoded as text (base64 payloads decoded). */
  readonly payloadText: string;
  readonly lastError: string;
  readonly occurrences: number;
  readonly firstSeenAt: Date;
  readonly lastSeenAt: Date;
}

/** One entry of `core.ops_audit`, as a letter's history shows it. */
export interface AuditEntry {
  readonly id: string;
  readonly at: Date;
  readonly operator: string;
  readonly action: string;
  readonly result: string;
  readonly detail: string | null;
}

/** A letter created after a replay of its job and consumer: the replayed job failed again. */
export interface ReplayFailure extends DeadLetterSummary {
  /** The replayed letter whose replay this failure followed (the latest replay before it). */
  readonly replayedFrom: string;
  /** The batch that replayed it; null for a direct replay. */
  readonly batchId: string | null;
}

/** History entries `get` includes; the rest through `history()`. */
export const HISTORY_IN_DETAIL = 100;
/** Audit entries younger than this are never pruned, whatever the retention asked. */
export const MIN_AUDIT_RETENTION_DAYS = 30;
/** The audit retention of `pnpm ops audit prune` when none is given. */
export const DEFAULT_AUDIT_RETENTION_DAYS = 400;

/** Per id, what an action did. */
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

/** The longest a replay batch may live (`expiresAt`): 30 days. */
export const MAX_BATCH_LIFETIME_MS = 30 * 86_400_000;

export type ActionOutcome =
  | "discarded"
  | "replayed"
  | "not_found"
  | "not_pending"
  | "not_replayable"
  | "not_routable"
  | "needs_approval"
  | "failed";
export interface ActionReport {
  readonly results: { readonly id: string; readonly outcome: ActionOutcome; readonly detail?: string }[];
  readonly counts: Partial<Record<ActionOutcome, number>>;
}

const pageSchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.uuid({ error: "is not a cursor from a previous page" }).optional(),
  order: z.enum(["newest", "oldest"]).default("newest"),
});
export type PageRequest = z.input<typeof pageSchema>;

const historyPageSchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.uuid({ error: "is not a cursor from a previous page" }).optional(),
});
export type HistoryPageRequest = z.input<typeof historyPageSchema>;

/** The replay view's cursor: the replayed letter and the failure last returned. */
const REPLAY_CURSOR =
  /^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;
const replayPageSchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().toLowerCase().regex(REPLAY_CURSOR, { error: "is not a cursor from a previous page" }).optional(),
});
export type ReplayPageRequest = z.input<typeof replayPageSchema>;
/** Past every id: a cursor that resumes after a replayed letter, whichever failures it had. */
const AFTER_ALL = "ffffffff-ffff-ffff-ffff-ffffffffffff";

const pruneSchema = z.strictObject({
  operator: operatorSchema,
  retentionDays: z.coerce
    .number()
    .int()
    .min(MIN_AUDIT_RETENTION_DAYS, { error: `must be at least ${MIN_AUDIT_RETENTION_DAYS} days` })
    .max(36_500),
  batchSize: z.coerce.number().int().min(1).max(50_000).default(5000),
  dryRun: z.boolean().default(false),
});
export type PruneAuditInput = z.input<typeof pruneSchema>;
export interface PruneAuditReport {
  /** Entries deleted (in a dry run: older than the cutoff, that a run would delete). */
  readonly deleted: number;
  /** Entries at or after this instant were kept. */
  readonly cutoff: Date;
  readonly batches: number;
  readonly dryRun: boolean;
}

const summaryColumns = (() => {
  const { payload: _payload, ...rest } = getTableColumns(deadLetters);
  return rest;
})();

/** The filter as SQL conditions. */
export function filterConditions(filter: ParsedFilter): SQL[] {
  const c: SQL[] = [];
  if (filter.queue) c.push(eq(deadLetters.queue, filter.queue));
  if (filter.consumer) c.push(eq(deadLetters.consumer, filter.consumer));
  if (filter.tenantId) c.push(eq(deadLetters.tenantId, filter.tenantId));
  if (filter.kind) c.push(eq(deadLetters.kind, filter.kind));
  if (filter.errorClass) c.push(eq(deadLetters.errorClass, filter.errorClass));
  if (filter.status) c.push(eq(deadLetters.status, filter.status));
  if (filter.createdAfter) c.push(gte(deadLetters.createdAt, filter.createdAfter));
  if (filter.createdBefore) c.push(lt(deadLetters.createdAt, filter.createdBefore));
  return c;
}

/** Decodes a stored payload and reads it as an envelope, if it is one. */
export function decodePayload(row: Pick<DeadLetterRow, "payload" | "payloadEncoding">): {
  text: string;
  envelope: Envelope | null;
  problem?: string;
} {
  const text = row.payloadEncoding === "base64" ? Buffer.from(row.payload, "base64").toString("utf8") : row.payload;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { text, envelope: null, problem: "the payload is not JSON" };
  }
  const check = checkEnvelope(value);
  return check.ok
    ? { text, envelope: check.envelope }
    : { text, envelope: null, problem: `not an envelope: ${check.issues.join("; ")}` };
}

export class DeadLetterOperations {
  readonly db: AnyPgDatabase;
  readonly replayTransport: ReplayTransport;
  readonly metrics: OpsMetricsPort;
  readonly clock: Clock;
  readonly maxDirectReplay: number;
  readonly approvalThreshold: number;
  readonly approvalWindowMs: number;
  readonly publishTimeoutMs: number;

  constructor(deps: OpsDeps) {
    this.db = deps.db;
    if (deps.replay) this.replayTransport = deps.replay;
    else if (deps.queue) this.replayTransport = replayTransportFor(deps.queue, deps.routes);
    else
      throw new InvalidConfigError(
        "the dead-letter operations need `replay` (or a `queue` adapter) to publish replays",
      );
    this.approvalThreshold = deps.approvalThreshold ?? 100;
    this.approvalWindowMs = deps.approvalWindowMs ?? 86_400_000;
    this.metrics = deps.metrics ?? noopOpsMetrics;
    this.clock = deps.clock ?? systemClock;
    this.maxDirectReplay = deps.maxDirectReplay ?? 100;
    this.publishTimeoutMs = deps.publishTimeoutMs ?? 10_000;
    if (!Number.isFinite(this.publishTimeoutMs) || this.publishTimeoutMs <= 0) {
      throw new InvalidConfigError(
        `the dead-letter operations: publishTimeoutMs must be a positive number of milliseconds, got ${deps.publishTimeoutMs}`,
      );
    }
  }

  /** Letters matching `filter`, newest (or oldest) first, `limit` at a time. */
  async list(filter: DeadLetterFilter = {}, page: PageRequest = {}): Promise<Page<DeadLetterSummary>> {
    const f = parseInput(deadLetterFilterSchema, filter, "filter");
    const p = parseInput(pageSchema, page, "page");
    const conditions = filterConditions(f);
    // Ids are UUID v7, so id order is creation order: the cursor is the last id seen.
    if (p.cursor) conditions.push(p.order === "newest" ? lt(deadLetters.id, p.cursor) : gt(deadLetters.id, p.cursor));
    const rows = await this.db
      .select(summaryColumns)
      .from(deadLetters)
      .where(and(...conditions))
      .orderBy(p.order === "newest" ? desc(deadLetters.id) : asc(deadLetters.id))
      .limit(p.limit + 1);
    const items = rows.slice(0, p.limit);
    return { items, nextCursor: rows.length > p.limit ? (items.at(-1)?.id ?? null) : null };
  }

  async count(filter: DeadLetterFilter = {}): Promise<number> {
    const f = parseInput(deadLetterFilterSchema, filter, "filter");
    const [row] = await this.db
      .select({ n: sql<number>`count(*)::int` })
      .from(deadLetters)
      .where(and(...filterConditions(f)));
    return row?.n ?? 0;
  }

  /** One letter with its payload, the failures related to it, and its audit history. */
  async get(id: string): Promise<DeadLetterDetail> {
    const [letterId] = parseInput(idListSchema, [id], "id");
    const [row] = await this.db
      .select()
      .from(deadLetters)
      .where(eq(deadLetters.id, letterId as string));
    if (!row) throw new OpsError("NOT_FOUND", `no dead letter ${id}`);
    const related = row.jobId
      ? await this.db
          .select(summaryColumns)
          .from(deadLetters)
          .where(
            and(
              eq(deadLetters.jobId, row.jobId),
              eq(deadLetters.consumer, row.consumer),
              sql`${deadLetters.id} <> ${row.id}`,
            ),
          )
          .orderBy(asc(deadLetters.id))
      : [];
    const others = await this.db
      .select()
      .from(deadLetterPayloads)
      .where(eq(deadLetterPayloads.deadLetterId, row.id))
      .orderBy(asc(deadLetterPayloads.firstSeenAt), asc(deadLetterPayloads.payloadSha256));
    const history = await this.#history(row, { limit: HISTORY_IN_DETAIL });
    const decoded = decodePayload(row);
    return {
      ...row,
      payloadText: decoded.text,
      envelope: decoded.envelope,
      related,
      otherPayloads: others.map(({ deadLetterId: _letter, ...other }) => ({
        ...other,
        payloadText: decodePayload(other).text,
      })),
      history: history.items,
      historyNextCursor: history.nextCursor,
    };
  }

  /**
   * A letter's audit history, oldest first, a page at a time: the entries
   * whose ids name it, and those of the batch that replayed it. Both lookups
   * are index scans (ops_audit_scope_ids_idx, ops_audit_scope_batch_idx),
   * whatever the size of the audit.
   */
  async history(id: string, page: HistoryPageRequest = {}): Promise<Page<AuditEntry>> {
    const [letterId] = parseInput(idListSchema, [id], "id");
    const [row] = await this.db
      .select({ id: deadLetters.id, replayBatchId: deadLetters.replayBatchId })
      .from(deadLetters)
      .where(eq(deadLetters.id, letterId as string));
    if (!row) throw new OpsError("NOT_FOUND", `no dead letter ${id}`);
    return this.#history(row, page);
  }

  async #history(
    row: { id: string; replayBatchId: string | null },
    page: HistoryPageRequest,
  ): Promise<Page<AuditEntry>> {
    const p = parseInput(historyPageSchema, page, "page");
    const names = row.replayBatchId
      ? sql`(${opsAudit.scope} -> 'ids' ? ${row.id} or ${opsAudit.scope} ->> 'batchId' = ${row.replayBatchId})`
      : sql`${opsAudit.scope} -> 'ids' ? ${row.id}`;
    // Ids are UUID v7, written in order: id order is the order the entries were written.
    const rows = await this.db
      .select({
        id: opsAudit.id,
        at: opsAudit.at,
        operator: opsAudit.operator,
        action: opsAudit.action,
        result: opsAudit.result,
        detail: opsAudit.detail,
      })
      .from(opsAudit)
      .where(and(names, p.cursor ? gt(opsAudit.id, p.cursor) : undefined))
      .orderBy(asc(opsAudit.id))
      .limit(p.limit + 1);
    const items = rows.slice(0, p.limit);
    return { items, nextCursor: rows.length > p.limit ? (items.at(-1)?.id ?? null) : null };
  }

  /**
   * Deletes audit entries older than `retentionDays` (at least
   * MIN_AUDIT_RETENTION_DAYS: nothing younger is ever deleted), oldest first,
   * in bounded batches through ops_audit_at_idx. The prune is audited itself.
   */
  async pruneAudit(input: PruneAuditInput): Promise<PruneAuditReport> {
    const scope = { retentionDays: input?.retentionDays, dryRun: input?.dryRun ?? false };
    const describe = (r: PruneAuditReport) =>
      `${r.dryRun ? "would delete" : "deleted"} ${r.deleted} entries older than ${r.cutoff.toISOString()}`;
    return this.#audited(operatorName(input?.operator), "audit.prune", scope, describe, async () => {
      const p = parseInput(pruneSchema, input, "prune");
      // `at` is written with this clock, so the cutoff is taken from it too.
      const cutoff = new Date(this.clock.now() - p.retentionDays * 86_400_000);
      if (p.dryRun) {
        // Bounded like a run: counted a batch at a time, resuming after the
        // last (at, id) read (carried as text: a Date would lose microseconds).
        let counted = 0;
        let batches = 0;
        let after: string | undefined;
        for (;;) {
          const position = after
            ? sql`and (at, id) > (split_part(${after}, '|', 1)::timestamptz, split_part(${after}, '|', 2)::uuid)`
            : sql``;
          const result = await this.db.execute(sql`
            with page as (
              select at, id from core.ops_audit where at < ${cutoff.toISOString()}::timestamptz ${position}
              order by at, id limit ${p.batchSize})
            select (select count(*)::int from page) as n,
                   (select at::text || '|' || id from page order by at desc, id desc limit 1) as last`);
          const [row] = rowsOf<{ n: number; last: string | null }>(result);
          batches += 1;
          counted += row?.n ?? 0;
          if (!row?.last || (row.n ?? 0) < p.batchSize) break;
          after = row.last;
        }
        return { deleted: counted, cutoff, batches, dryRun: true };
      }
      let deleted = 0;
      let batches = 0;
      for (;;) {
        const result = await this.db.execute(sql`
          with victim as (
            delete from core.ops_audit where id in (
              select id from core.ops_audit where at < ${cutoff.toISOString()}::timestamptz
              order by at limit ${p.batchSize} for update skip locked)
            returning 1)
          select count(*)::int as n from victim`);
        const n = rowsOf<{ n: number }>(result)[0]?.n ?? 0;
        batches += 1;
        deleted += n;
        if (n < p.batchSize) break;
      }
      return { deleted, cutoff, batches, dryRun: false };
    });
  }

  /** Marks pending letters `discarded` with who, when and why. A reason is required (the database enforces it too). */
  async discard(ids: readonly string[], input: { operator: string; reason: string }): Promise<ActionReport> {
    return this.#auditedAction("dead_letter.discard", ids, input, async ({ operator, reason, idList }) => {
      const updated = await this.db
        .update(deadLetters)
        .set({
          status: "discarded",
          statusChangedAt: sql`now()`, // database time, like created_at
          statusChangedBy: operator,
          statusReason: reason,
        })
        .where(and(inArray(deadLetters.id, idList), eq(deadLetters.status, "pending_review")))
        .returning({ id: deadLetters.id });
      const done = new Set(updated.map((r) => r.id));
      return this.#report(idList, done, "discarded");
    });
  }

  /**
   * Replays pending letters one by one; see `replayOne`. More than
   * `maxDirectReplay` at once is refused: that is a batch's job (rate limit,
   * sample, approval).
   */
  async replay(ids: readonly string[], input: { operator: string; reason: string }): Promise<ActionReport> {
    return this.#auditedAction("dead_letter.replay", ids, input, async ({ operator, reason, idList }) => {
      if (idList.length > this.maxDirectReplay) {
        throw new OpsError(
          "INVALID_INPUT",
          `replaying ${idList.length} letters at once is more than ${this.maxDirectReplay}: create a replay batch (rate limit, sample, approval) instead`,
        );
      }
      // The two-person rule counts everything one requester replays over the
      // window, so a loop of small direct replays cannot side-step it.
      const recent = await this.replayedWithoutApproval(operator);
      if (recent + idList.length > this.approvalThreshold) {
        throw new OpsError(
          "FORBIDDEN",
          `${operator} replayed ${recent} letters without a second operator's approval in the last ${formatWindow(this.approvalWindowMs)}; ${idList.length} more would pass the approval threshold of ${this.approvalThreshold}: create a replay batch and have another operator approve it`,
        );
      }
      const results: ActionReport["results"][number][] = [];
      for (const id of idList) {
        // Counted again for each letter, under the requester's quota lock and
        // in the transaction that claims it: of two direct replays of one
        // operator at the same time, neither can pass the threshold by
        // counting before the other's claims commit.
        const { outcome, detail } = await this.replayOne(id, { operator, reason, batchId: null });
        // Only a batch's claim can be halted (it has a guard); a direct replay never is.
        if (outcome === "halted") throw new Error(`direct replay of ${id} was halted: ${detail}`);
        results.push({ id, outcome, ...(detail ? { detail } : {}) });
      }
      return summarize(results);
    });
  }

  /**
   * What `operator` replayed without a second operator over the approval
   * window (`approvalWindowMs`): letters they replayed directly, and the
   * letters of batches they requested that nobody approved (what a finished
   * batch replayed; what one still to run selected). Index scans
   * (dead_letters_direct_replays_idx, replay_batches_requester_idx).
   */
  async replayedWithoutApproval(
    operator: string,
    db: Pick<AnyPgDatabase, "execute"> = this.db,
    count: "published" | "published_and_queued" = "published_and_queued",
  ): Promise<number> {
    const since = new Date(this.clock.now() - this.approvalWindowMs).toISOString();
    // Replays count when they happen (#21 item 4), whenever their batch was
    // made: a batch lives up to MAX_BATCH_LIFETIME, so its letters are looked
    // for among the batches made that long before the window.
    const batchesSince = new Date(this.clock.now() - this.approvalWindowMs - MAX_BATCH_LIFETIME_MS).toISOString();
    const queued =
      count === "published"
        ? sql`0`
        : sql`(select coalesce(sum(greatest(selected - replayed - skipped, 0)), 0)::int
              from core.replay_batches
              where requested_by = ${operator} and approved_by is null
                and status in ('ready', 'running', 'paused'))`;
    const result = await db.execute(sql`
      select (select count(*)::int from core.dead_letters
              where status = 'replayed' and replay_batch_id is null
                and status_changed_by = ${operator} and status_changed_at >= ${since}::timestamptz)
           + (select count(*)::int
              from core.replay_batches b
              join core.dead_letters d on d.replay_batch_id = b.id and d.status = 'replayed'
              where b.requested_by = ${operator} and b.approved_by is null
                and b.created_at >= ${batchesSince}::timestamptz
                and d.status_changed_at >= ${since}::timestamptz)
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
  async lockBatch(tx: Pick<AnyPgDatabase, "execute">, batchId: string, mode: "shared" | "exclusive"): Promise<void> {
    await tx.execute(
      mode === "shared"
        ? sql`select pg_advisory_xact_lock_shared(hashtext('softcrum.ops.batch'), hashtext(${batchId}))`
        : sql`select pg_advisory_xact_lock(hashtext('softcrum.ops.batch'), hashtext(${batchId}))`,
    );
  }

  async lockReplayQuota(tx: Pick<AnyPgDatabase, "execute">, operator: string): Promise<void> {
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
  async #batchMayClaim(
    tx: Pick<AnyPgDatabase, "execute">,
    batchId: string,
    guard: BatchClaimGuard,
  ): Promise<BatchHalt | undefined> {
    await this.lockBatch(tx, batchId, "shared");
    const [batch] = rowsOf<{
      status: string;
      lease_owner: string | null;
      expires_at: string | Date;
      approved_by: string | null;
      requested_by: string;
    }>(
      await tx.execute(sql`
        select status, lease_owner, expires_at, approved_by, requested_by
        from core.replay_batches where id = ${batchId}`),
    );
    const now = this.clock.now();
    if (!batch) return { cause: "state", reason: `batch ${batchId} no longer exists` };
    if (batch.status !== "running") return { cause: "state", reason: `batch is ${batch.status}` };
    if (batch.lease_owner !== guard.runner) return { cause: "state", reason: "another runner took the batch over" };
    if (new Date(batch.expires_at).getTime() <= now) return { cause: "expired", reason: "expired before it finished" };
    if (guard.deadline !== null && now >= guard.deadline) {
      return { cause: "deadline", reason: "this run's maxDurationMs is over" };
    }
    if (batch.approved_by === null) {
      await this.lockReplayQuota(tx, batch.requested_by);
      const recent = await this.replayedWithoutApproval(batch.requested_by, tx, "published");
      if (recent >= this.approvalThreshold) {
        return {
          cause: "needs_approval",
          reason: `needs approval: ${batch.requested_by} replayed ${recent} letters without a second operator's approval in the last ${formatWindow(this.approvalWindowMs)}, the approval threshold of ${this.approvalThreshold}; another operator must approve the rest of this batch`,
        };
      }
    }
    return undefined;
  }

  /**
   * Republishes one letter's original envelope (same job_id, no dedup key)
   * and marks it `replayed`. The status change is conditional and held in the
   * same transaction as the publish: of two operators replaying the same
   * letter, one publishes and the other finds it no longer pending; if the
   * publish fails, the letter stays pending. Not audited on its own: callers are.
   */
  async replayOne(
    id: string,
    input: { operator: string; reason: string; batchId: string | null; guard?: BatchClaimGuard },
  ): Promise<{
    outcome: ActionOutcome | "halted";
    detail?: string;
    replayBatchId?: string | null;
    halt?: BatchHalt;
  }> {
    const [row] = await this.db
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
    if (row.status !== "pending_review") {
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
    const route = this.replayTransport.route(row.queue, row.consumer);
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
    try {
      return await this.db
        .transaction(async (tx) => {
          if (input.batchId === null) {
            // A direct replay: the two-person rule, checked where it cannot race.
            await this.lockReplayQuota(tx, input.operator);
            const recent = await this.replayedWithoutApproval(input.operator, tx);
            if (recent >= this.approvalThreshold) return { outcome: "needs_approval" as const, recent };
          } else if (input.guard !== undefined) {
            const halt = await this.#batchMayClaim(tx, input.batchId, input.guard);
            if (halt !== undefined) return { outcome: "halted" as const, halt };
          }
          const [claimed] = await tx
            .update(deadLetters)
            .set({
              status: "replayed",
              // Database time: the replay-DLQ view compares it with dead letters' created_at.
              statusChangedAt: sql`now()`,
              statusChangedBy: input.operator,
              statusReason: input.reason,
              replayBatchId: input.batchId,
            })
            .where(and(eq(deadLetters.id, id), eq(deadLetters.status, "pending_review")))
            .returning({ queue: deadLetters.queue, consumer: deadLetters.consumer });
          if (!claimed) return { outcome: "lost" as const };
          // Only to the letter's consumer, on its replay lane: the queue's other
          // consumers either have their fence already or had their own letter
          // for this job handled separately (perhaps discarded on purpose).
          // Delivered as a replay: an operator asked for it, so it is not expired (maxAgeMs).
          // No answer in time is no answer: not stored (rolled back below).
          const receipt = await withinMs(
            this.replayTransport.publishReplay(claimed.queue, claimed.consumer, body),
            this.publishTimeoutMs,
            () =>
              new Error(
                `the transport did not answer the replay's publish within ${this.publishTimeoutMs} ms; replay it again`,
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
          this.metrics.replayed(claimed);
          return { outcome: "replayed" as const };
        })
        .then(async (result) => {
          if (result.outcome === "halted")
            return { outcome: "halted" as const, detail: result.halt.reason, halt: result.halt };
          if (result.outcome === "needs_approval") {
            return {
              outcome: "needs_approval" as const,
              detail: `${input.operator} replayed ${result.recent} letters without a second operator's approval in the last ${formatWindow(this.approvalWindowMs)}, the approval threshold of ${this.approvalThreshold}: replay it in an approved batch`,
            };
          }
          if (result.outcome !== "lost") return result;
          // Lost the race: say who won, so a batch runner counts a letter its own
          // batch replayed (an earlier runner) as replayed, not skipped.
          const [now] = await this.db
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
   * The replay-DLQ view: letters created after a replay of the same job and
   * consumer, i.e. replayed jobs that failed again, with the letter and batch
   * that replayed them; ordered by the replayed letter, then the failure.
   *
   * It starts from replayed letters (dead_letters_replayed_idx, or
   * dead_letters_replayed_batch_idx with `batchId`) and looks up each one's
   * later letters by job and consumer, so no request reads the whole table:
   * a page examines at most `max(5000, 50 × limit)` replayed letters. A page
   * can therefore hold fewer than `limit` items (even none) and still have a
   * `nextCursor`: follow it until it is null.
   */
  async failedAfterReplay(
    filter: { batchId?: string } = {},
    page: ReplayPageRequest = {},
  ): Promise<Page<ReplayFailure>> {
    const batchId = filter.batchId === undefined ? undefined : parseInput(z.uuid(), filter.batchId, "batch id");
    const p = parseInput(replayPageSchema, page, "page");
    const [, afterReplayed, afterFailure] = p.cursor ? (REPLAY_CURSOR.exec(p.cursor) as RegExpExecArray) : [];
    const budget = Math.max(5000, p.limit * 50);
    // Each later letter belongs to the latest replay of its job and consumer
    // before it (ties broken by id): a chain of replays lists every failure
    // once, under its own batch.
    const replayed = sql`
        from core.dead_letters o
        where o.status = 'replayed'
          ${batchId ? sql`and o.replay_batch_id = ${batchId}::uuid` : sql``}
          ${afterReplayed ? sql`and o.id >= ${afterReplayed}::uuid` : sql``}
        order by o.id`;
    // The replayed letters come in id order from the partial index and the
    // lookups run one replayed letter at a time, so the page stops as soon as
    // it has its rows; the budget bounds it when failures are rare.
    const result = await this.db.execute(sql`
      select n.id::text, s.id::text as replayed_from, s.replay_batch_id::text as batch_id
      from (select o.id, o.job_id, o.consumer, o.status_changed_at, o.replay_batch_id ${replayed} limit ${budget}) s
      cross join lateral (
        select n.id from core.dead_letters n
        where n.job_id = s.job_id and n.consumer = s.consumer and n.id <> s.id
          and n.created_at >= s.status_changed_at
          and not exists (
            select 1 from core.dead_letters l
            where l.job_id = s.job_id and l.consumer = s.consumer and l.id <> n.id and l.status = 'replayed'
              and l.status_changed_at <= n.created_at
              and (l.status_changed_at > s.status_changed_at or (l.status_changed_at = s.status_changed_at and l.id > s.id)))
      ) n
      ${afterReplayed ? sql`where s.id > ${afterReplayed}::uuid or n.id > ${afterFailure}::uuid` : sql``}
      order by s.id, n.id
      limit ${p.limit + 1}`);
    const links = rowsOf<{ id: string; replayed_from: string; batch_id: string | null }>(result);
    const pageLinks = links.slice(0, p.limit);
    const letters = pageLinks.length
      ? await this.db
          .select(summaryColumns)
          .from(deadLetters)
          // One array parameter, never a list of them: a page is at most 500 ids.
          .where(sql`${deadLetters.id} = any(${sql.param(pageLinks.map((l) => l.id))}::uuid[])`)
      : [];
    const byId = new Map(letters.map((l) => [l.id, l]));
    const items = pageLinks.flatMap((l) => {
      const letter = byId.get(l.id);
      return letter ? [{ ...letter, replayedFrom: l.replayed_from, batchId: l.batch_id }] : [];
    });
    const last = pageLinks.at(-1);
    if (links.length > p.limit && last) return { items, nextCursor: `${last.replayed_from}.${last.id}` };
    // Short page: it read every replayed letter left, or stopped at the budget's last one.
    const [budgetEnd] = rowsOf<{ id: string }>(
      await this.db.execute(sql`select o.id::text ${replayed} offset ${budget - 1} limit 1`),
    );
    const nextCursor = budgetEnd ? `${budgetEnd.id}.${AFTER_ALL}` : null;
    return { items, nextCursor };
  }

  /** Pending depth and the age of the oldest pending letter, per queue and consumer (for gauges and dashboards). */
  async depth(): Promise<{ queue: string; consumer: string; pending: number; oldestPendingAgeMs: number }[]> {
    const rows = await this.db
      .select({
        queue: deadLetters.queue,
        consumer: deadLetters.consumer,
        pending: sql<number>`count(*)::int`,
        oldest: sql<Date>`min(${deadLetters.createdAt})`.mapWith(deadLetters.createdAt),
      })
      .from(deadLetters)
      .where(eq(deadLetters.status, "pending_review"))
      .groupBy(deadLetters.queue, deadLetters.consumer)
      .orderBy(deadLetters.queue, deadLetters.consumer);
    const now = this.clock.now();
    return rows.map((r) => ({
      queue: r.queue,
      consumer: r.consumer,
      pending: r.pending,
      oldestPendingAgeMs: Math.max(0, now - r.oldest.getTime()),
    }));
  }

  /** Records an operator action and its result; a refused or failed action is recorded too. */
  async audit(entry: {
    operator: string;
    action: string;
    scope: unknown;
    result: "ok" | "rejected" | "refused" | "error";
    detail?: string;
  }) {
    await this.db.insert(opsAudit).values({
      id: uuidv7(),
      at: new Date(this.clock.now()),
      operator: entry.operator,
      action: entry.action,
      scope: entry.scope ?? {},
      result: entry.result,
      detail: entry.detail ?? null,
    });
  }

  /** Runs an action and audits it: ok, or rejected (OpsError) / error (anything else), then rethrows. */
  async #audited<T extends ActionReport | object>(
    operator: string,
    action: string,
    scope: unknown,
    describe: ((result: T) => string) | undefined,
    run: () => Promise<T>,
  ): Promise<T> {
    try {
      const result = await run();
      const detail = describe
        ? describe(result)
        : "counts" in result
          ? JSON.stringify((result as ActionReport).counts)
          : undefined;
      await this.audit({
        operator,
        action,
        scope,
        result: actedOnNothing(result) ? "refused" : "ok",
        ...(detail ? { detail } : {}),
      });
      return result;
    } catch (error) {
      const rejected = error instanceof OpsError;
      await this.audit({
        operator,
        action,
        scope,
        result: rejected ? "rejected" : "error",
        detail: describeError(error),
      }).catch(() => {});
      throw markAudited(error);
    }
  }

  audited<T extends object>(operator: string, action: string, scope: unknown, run: () => Promise<T>): Promise<T> {
    return this.#audited(operator, action, scope, undefined, run);
  }

  /**
   * Validates an id-list action and runs it audited. Invalid input is audited
   * too (as rejected), under the operator given if it is usable.
   */
  async #auditedAction(
    action: string,
    ids: readonly string[],
    input: { operator: string; reason: string },
    run: (valid: { operator: string; reason: string; idList: string[] }) => Promise<ActionReport>,
  ): Promise<ActionReport> {
    const named =
      typeof input?.operator === "string" && input.operator.trim() !== "" ? input.operator.trim() : "(none given)";
    const scope = { ids: Array.isArray(ids) ? ids.slice(0, 1000) : ids, reason: input?.reason };
    return this.#audited(named, action, scope, undefined, () => {
      const operator = parseInput(operatorSchema, input?.operator, "operator");
      const reason = parseInput(reasonSchema, input?.reason, "reason");
      const idList = [...new Set(parseInput(idListSchema, ids, "ids"))];
      return run({ operator, reason, idList });
    });
  }

  async #report(ids: string[], done: Set<string>, outcome: ActionOutcome): Promise<ActionReport> {
    const rest = ids.filter((id) => !done.has(id));
    const existing = rest.length
      ? await this.db
          .select({ id: deadLetters.id, status: deadLetters.status })
          .from(deadLetters)
          .where(inArray(deadLetters.id, rest))
      : [];
    const status = new Map(existing.map((r) => [r.id, r.status]));
    return summarize(
      ids.map((id) => {
        if (done.has(id)) return { id, outcome };
        const s = status.get(id);
        return s
          ? { id, outcome: "not_pending" as const, detail: `status is ${s}` }
          : { id, outcome: "not_found" as const };
      }),
    );
  }
}

function formatWindow(ms: number): string {
  return ms % 3_600_000 === 0 ? `${ms / 3_600_000} h` : `${Math.round(ms / 60_000)} min`;
}

/** Why a letter is not pending, naming the batch (or operator) that replayed it. */
function notPendingDetail(row: {
  status: string;
  replayBatchId: string | null;
  statusChangedBy?: string | null;
}): string {
  if (row.status !== "replayed") return `status is ${row.status}`;
  const by = row.replayBatchId
    ? `, by batch ${row.replayBatchId}`
    : row.statusChangedBy
      ? `, by ${row.statusChangedBy}`
      : "";
  return `status is replayed${by}: nothing to do`;
}

/** An action report that acted on nothing (every id refused, missing or already handled) is audited as refused, not ok. */
function actedOnNothing(result: object): boolean {
  if (!("counts" in result) || !("results" in result)) return false;
  const { counts, results } = result as ActionReport;
  return results.length > 0 && !counts.replayed && !counts.discarded;
}

/** The operator to record for an action, even when the given one is invalid. */
export function operatorName(operator: unknown): string {
  return typeof operator === "string" && operator.trim() !== "" ? operator.trim().slice(0, 200) : "(none given)";
}

function summarize(results: ActionReport["results"][number][]): ActionReport {
  const counts: Partial<Record<ActionOutcome, number>> = {};
  for (const r of results) counts[r.outcome] = (counts[r.outcome] ?? 0) + 1;
  return { results, counts };
}

/** postgres.js returns rows as an array, PGlite and node-postgres as `{ rows }`. */
export function rowsOf<T>(result: unknown): T[] {
  return (Array.isArray(result) ? result : ((result as { rows?: T[] }).rows ?? [])) as T[];
}
