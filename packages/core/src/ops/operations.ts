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
import { and, asc, desc, eq, getTableColumns, gt, inArray, lt, sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { z } from "zod";
import { type Clock, systemClock } from "../clock.ts";
import { deadLetterPayloads, deadLetters, opsAudit } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { describeError, InvalidConfigError, OpsError } from "../errors.ts";
import {
  type DeadLetterFilter,
  deadLetterFilterSchema,
  idListSchema,
  operatorSchema,
  parseInput,
  reasonSchema,
} from "./filters.ts";
import {
  actedOnNothing,
  decodePayload,
  filterConditions,
  formatWindow,
  operatorName,
  rowsOf,
  summarize,
} from "./ops-helpers.ts";
import {
  type ActionOutcome,
  type ActionReport,
  type AuditEntry,
  type DeadLetterDetail,
  type DeadLetterSummary,
  HISTORY_IN_DETAIL,
  MIN_AUDIT_RETENTION_DAYS,
  noopOpsMetrics,
  type OpsDeps,
  type OpsMetricsPort,
  type Page,
  type ReplayFailure,
} from "./ops-types.ts";
import { markAudited } from "./refusals.ts";
import * as claim from "./replay-claim.ts";
import { type ReplayTransport, replayTransportFor } from "./routes.ts";
import type { StrainMonitor } from "./strain.ts";

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

export class DeadLetterOperations {
  readonly db: AnyPgDatabase;
  readonly replayTransport: ReplayTransport;
  readonly metrics: OpsMetricsPort;
  readonly clock: Clock;
  readonly maxDirectReplay: number;
  readonly approvalThreshold: number;
  readonly approvalWindowMs: number;
  readonly publishTimeoutMs: number;
  /** Where batch runners read their consumers' strain (#21 item 5); undefined: not checked. */
  readonly strain: StrainMonitor | undefined;

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
    this.strain = deps.strain;
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
        // Through the database's function: an operator's role may not delete
        // audit rows itself, nor any younger than the minimum retention.
        const result = await this.db.execute(
          sql`select core.ops_prune_audit(${cutoff.toISOString()}::timestamptz, ${p.batchSize}) as n`,
        );
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
      // The database records who (ops_discard_letters binds the actor to the session).
      const updated = rowsOf<{ id: string }>(
        await this.db.execute(
          sql`select id::text from core.ops_discard_letters(${sql.param(idList)}::uuid[], ${operator}, ${reason}) as id`,
        ),
      );
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
    return this.#replayMany("dead_letter.replay", ids, input, false);
  }

  /**
   * Replays again letters that are `replayed` but whose replay never ran:
   * their job has neither a fence nor a newer letter of the consumer since
   * the replay (the copy was lost: an in-process queue killed mid-way). A
   * replay that did run is reported `not_pending`; the rules of `replay`
   * (at most `maxDirectReplay`, the two-person rule) hold (#21 item 4).
   */
  async replayAgain(ids: readonly string[], input: { operator: string; reason: string }): Promise<ActionReport> {
    return this.#replayMany("dead_letter.replay_again", ids, input, true);
  }

  async #replayMany(
    action: string,
    ids: readonly string[],
    input: { operator: string; reason: string },
    again: boolean,
  ): Promise<ActionReport> {
    return this.#auditedAction(action, ids, input, async ({ operator, reason, idList }) => {
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
        const { outcome, detail } = await this.replayOne(id, { operator, reason, batchId: null, again });
        // Only a batch's claim can be halted (it has a guard); a direct replay never is.
        if (outcome === "halted") throw new Error(`direct replay of ${id} was halted: ${detail}`);
        results.push({ id, outcome, ...(detail ? { detail } : {}) });
      }
      return summarize(results);
    });
  }

  /**
   * What became of replayed letters' jobs so far (#21 item 9): succeeded
   * (a fence now), duplicate (a fence from before the replay), failed again
   * (a newer letter), not yet, or unknown: replayed before the consumer's
   * fence horizon, so the fence it wrote may be deleted (migration 0032).
   * Read-only; letters not replayed are left out.
   */
  async replayOutcomes(
    ids: readonly string[],
  ): Promise<{ id: string; outcome: "succeeded" | "duplicate" | "failed_again" | "not_yet" | "unknown" }[]> {
    const idList = [...new Set(parseInput(idListSchema, ids, "ids"))];
    const rows = rowsOf<{ id: string; succeeded: boolean; duplicate: boolean; failed: boolean; past: boolean }>(
      await this.db.execute(sql`
        select d.id::text as id, f.succeeded, f.duplicate, f.failed,
               exists (select 1 from core.fence_horizons h
                       where h.consumer = d.consumer and d.status_changed_at < h.cleaned_before) as past
        from core.dead_letters d
        cross join lateral core.ops_replay_outcome(d.id, d.job_id, d.consumer, d.status_changed_at) f
        where d.id = any(${sql.param(idList)}::uuid[]) and d.status = 'replayed'`),
    );
    return rows.map((r) => ({
      id: r.id,
      outcome: r.failed
        ? "failed_again"
        : r.duplicate
          ? "duplicate"
          : r.succeeded
            ? "succeeded"
            : r.past
              ? "unknown"
              : "not_yet",
    }));
  }

  /**
   * What `operator` replayed without a second operator over the approval
   * window (`approvalWindowMs`); see replay-claim.ts.
   */
  replayedWithoutApproval(
    operator: string,
    db: Pick<AnyPgDatabase, "execute"> = this.db,
    count: "published" | "published_and_queued" = "published_and_queued",
  ): Promise<number> {
    return claim.replayedWithoutApproval(this, operator, db, count);
  }

  /** A batch's control lock, until `tx` ends; see replay-claim.ts. */
  lockBatch(tx: Pick<AnyPgDatabase, "execute">, batchId: string, mode: "shared" | "exclusive"): Promise<void> {
    return claim.lockBatch(tx, batchId, mode);
  }

  /** Serialises what counts against one requester's approval threshold, until `tx` ends; see replay-claim.ts. */
  lockReplayQuota(tx: Pick<AnyPgDatabase, "execute">, operator: string): Promise<void> {
    return claim.lockReplayQuota(tx, operator);
  }

  /**
   * Republishes one letter's original envelope and marks it `replayed`, in
   * one transaction; see replay-claim.ts. Not audited on its own: callers are.
   */
  replayOne(id: string, input: claim.ReplayOneInput): Promise<claim.ReplayOneResult> {
    return claim.replayOne(this, id, input);
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
    // Through the database's function: the row's operator is the session's
    // role (or a trusted service's named subject), never a name typed here.
    await this.db.execute(sql`
      select core.ops_audit_write(${uuidv7()}::uuid, ${new Date(this.clock.now()).toISOString()}::timestamptz,
        ${entry.operator}, ${entry.action}, ${JSON.stringify(entry.scope ?? {})}::jsonb, ${entry.result},
        ${entry.detail ?? null})`);
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

export { decodePayload, filterConditions, operatorName, rowsOf } from "./ops-helpers.ts";
// Moved by role (ops-types.ts, ops-helpers.ts, replay-claim.ts); exported from here unchanged.
export type {
  ActionOutcome,
  ActionReport,
  AuditEntry,
  BatchRecoveryReport,
  DeadLetterDetail,
  DeadLetterSummary,
  OpsDeps,
  OpsMetricsPort,
  OtherPayload,
  Page,
  ReplayFailure,
} from "./ops-types.ts";
export {
  DEFAULT_AUDIT_RETENTION_DAYS,
  HISTORY_IN_DETAIL,
  MIN_AUDIT_RETENTION_DAYS,
  noopOpsMetrics,
} from "./ops-types.ts";
export type { BatchClaimGuard, BatchHalt } from "./replay-claim.ts";
export { MAX_BATCH_LIFETIME_MS } from "./replay-claim.ts";
