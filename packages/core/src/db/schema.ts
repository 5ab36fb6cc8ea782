import { sql } from "drizzle-orm";
import {
  bigserial,
  boolean,
  check,
  doublePrecision,
  index,
  integer,
  jsonb,
  pgSchema,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

/** Everything of the job infrastructure lives in the `core` schema. */
export const core = pgSchema("core");

/**
 * The idempotency fence. One row per (job, consumer) that committed its work;
 * written inside the work transaction and nowhere else. `processed_at` leads
 * the TTL cleanup's index.
 *
 * Range-partitioned by `job_id` (migration 0026, ADR 0014; drizzle cannot say
 * PARTITION BY, so this declaration is the parent's columns and indexes only):
 * one partition per UTC day of the UUID v7 time (`processed_jobs_pYYYYMMDD`,
 * bounds `core.fence_day_bound(day)`), created ahead by the maintenance, plus
 * `processed_jobs_default` (the table as it was before 0026). The primary key
 * holds the partition key, so a job's fence is unique across partitions.
 */
export const processedJobs = core.table(
  "processed_jobs",
  {
    jobId: uuid("job_id").notNull(),
    consumer: text("consumer").notNull(),
    processedAt: timestamp("processed_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.jobId, t.consumer] }),
    // The cleanup pages through expired rows in (processed_at, job_id, consumer)
    // order; rows written in one statement share processed_at, so the index
    // carries the whole key.
    index("processed_jobs_expiry_idx").on(t.processedAt, t.jobId, t.consumer),
  ],
);

export const DEAD_LETTER_STATUSES = ["pending_review", "replayed", "discarded"] as const;
export type DeadLetterStatus = (typeof DEAD_LETTER_STATUSES)[number];

/**
 * Why a job was dead-lettered:
 * - `poison`: the payload is not a valid envelope or fails the consumer's schema (never retried);
 * - `exhausted`: transient failures used up the retry budget, or deliveries kept
 *   crashing the worker until the transport's delivery count passed it;
 * - `permanent`: the handler threw `PermanentError` (a business rejection);
 * - `expired`: the job outlived the consumer's `maxAgeMs`.
 */
export const ERROR_CLASSES = ["poison", "exhausted", "permanent", "expired"] as const;
export type DeadLetterErrorClass = (typeof ERROR_CLASSES)[number];

/** Longest `last_error` kept, in characters; longer messages are cut. */
export const LAST_ERROR_MAX = 4000;

/**
 * A Postgres regex that matches text holding at least one character that
 * JavaScript's `trim()` would keep: the database's "not blank".
 */
export const NOT_BLANK_PATTERN =
  "[^\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff]";

const inList = (values: readonly string[]) => sql.raw(values.map((v) => `'${v}'`).join(", "));

/**
 * Evidence of every job that will not complete by itself. The payload is kept
 * exactly as received (text; base64 when the bytes were not UTF-8), so a
 * replay republishes the original and an operator can read what arrived.
 */
export const deadLetters = core.table(
  "dead_letters",
  {
    id: uuid("id").primaryKey(),
    /**
     * The job's id when the payload carried a valid one (UUID v7); null for
     * poison whose job_id is missing or invalid: an id that fails validation
     * is evidence (it is in the payload), not an identity, so such letters
     * are de-duplicated by their bytes only (`payload_sha256`).
     */
    jobId: text("job_id"),
    queue: text("queue").notNull(),
    consumer: text("consumer").notNull(),
    payload: text("payload").notNull(),
    payloadEncoding: text("payload_encoding").notNull().default("utf8"),
    /**
     * SHA-256 (hex) of the payload's bytes as received. A poison payload
     * without a readable job_id is de-duplicated on it: a redelivered copy
     * (lost ack, republish with a new message id) updates the pending letter.
     * Null on letters written before it existed.
     */
    payloadSha256: text("payload_sha256"),
    attempts: integer("attempts").notNull(),
    lastError: text("last_error").notNull(),
    errorClass: text("error_class").$type<DeadLetterErrorClass>().notNull(),
    status: text("status").$type<DeadLetterStatus>().notNull().default("pending_review"),
    tenantId: text("tenant_id"),
    correlationId: text("correlation_id"),
    kind: text("kind"),
    /** How many times this same (job, consumer) failed again while the row was pending review. */
    occurrences: integer("occurrences").notNull().default(1),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    lastSeenAt: timestamp("last_seen_at", { withTimezone: true }).notNull().defaultNow(),
    statusChangedAt: timestamp("status_changed_at", { withTimezone: true }),
    statusChangedBy: text("status_changed_by"),
    statusReason: text("status_reason"),
    /** The replay batch that replayed this letter (null for a single replay or none). */
    replayBatchId: uuid("replay_batch_id"),
  },
  (t) => [
    uniqueIndex("dead_letters_one_pending_per_job_consumer")
      .on(t.jobId, t.consumer)
      .where(sql`${t.status} = 'pending_review'`),
    uniqueIndex("dead_letters_one_pending_per_payload_without_job")
      .on(t.consumer, t.payloadSha256)
      .where(sql`${t.status} = 'pending_review' and ${t.jobId} is null`),
    index("dead_letters_status_created_idx").on(t.status, t.createdAt),
    index("dead_letters_queue_consumer_idx").on(t.queue, t.consumer, t.status),
    index("dead_letters_job_consumer_idx").on(t.jobId, t.consumer),
    // Operator queries and the depth gauge read pending letters only (#9 items
    // 10, 11): partial indexes stay small at millions of resolved letters.
    // Built CONCURRENTLY by their migration; the queue/consumer one also has
    // INCLUDE (created_at) there (drizzle cannot say INCLUDE), so the depth
    // gauge is an index-only scan.
    index("dead_letters_pending_tenant_idx").on(t.tenantId, t.id).where(sql`${t.status} = 'pending_review'`),
    index("dead_letters_pending_queue_consumer_idx")
      .on(t.queue, t.consumer, t.id)
      .where(sql`${t.status} = 'pending_review'`),
    index("dead_letters_pending_kind_class_idx")
      .on(t.kind, t.errorClass, t.id)
      .where(sql`${t.status} = 'pending_review'`),
    // The replay-DLQ view starts from replayed letters, in id order: all of
    // them, or one batch's (#9 item 13).
    index("dead_letters_replayed_idx").on(t.id).where(sql`${t.status} = 'replayed'`),
    index("dead_letters_replayed_batch_idx").on(t.replayBatchId, t.id).where(sql`${t.status} = 'replayed'`),
    // What one operator replayed directly over the approval window (#10 item 4).
    index("dead_letters_direct_replays_idx")
      .on(t.statusChangedBy, t.statusChangedAt)
      .where(sql`${t.status} = 'replayed' and ${t.replayBatchId} is null`),
    // Letters replayed or discarded less than a TTL ago keep their jobs'
    // fences: a fence partition's drop reads them by this range (#23 item 4).
    index("dead_letters_resolved_changed_idx")
      .on(t.statusChangedAt)
      .where(sql`${t.status} in ('replayed', 'discarded')`),
    check("dead_letters_status_valid", sql`${t.status} in (${inList(DEAD_LETTER_STATUSES)})`),
    check("dead_letters_error_class_valid", sql`${t.errorClass} in (${inList(ERROR_CLASSES)})`),
    check("dead_letters_payload_encoding_valid", sql`${t.payloadEncoding} in ('utf8', 'base64')`),
    check("dead_letters_attempts_nonnegative", sql`${t.attempts} >= 0`),
    check("dead_letters_last_error_bounded", sql`char_length(${t.lastError}) <= ${sql.raw(String(LAST_ERROR_MAX))}`),
    // Not blank by JavaScript's trim(), the API's rule: tabs, line breaks and
    // Unicode spaces are blank too (migration 0009, #10 item 7).
    check(
      "dead_letters_discard_reason_not_blank",
      sql`${t.status} <> 'discarded' or (${t.statusReason} is not null and ${t.statusReason} ~ '${sql.raw(NOT_BLANK_PATTERN)}')`,
    ),
    check(
      "dead_letters_status_change_recorded",
      sql`${t.status} = 'pending_review' or (${t.statusChangedAt} is not null and ${t.statusChangedBy} is not null and btrim(${t.statusChangedBy}) <> '')`,
    ),
  ],
);

/**
 * The other payloads of a pending letter: a job_id that arrived again with
 * bytes other than the letter's (a producer reusing an id, a bad redelivery).
 * A letter folds copies of the same bytes only; every other payload's
 * evidence is kept here, one row per distinct payload (SPEC §4: the payload
 * exactly as received), while the letter stays the job's one identity for
 * review and replay.
 */
export const deadLetterPayloads = core.table(
  "dead_letter_payloads",
  {
    deadLetterId: uuid("dead_letter_id")
      .notNull()
      .references(() => deadLetters.id, { onDelete: "cascade" }),
    payloadSha256: text("payload_sha256").notNull(),
    payload: text("payload").notNull(),
    payloadEncoding: text("payload_encoding").notNull(),
    /** The error of the latest copy of this payload. */
    lastError: text("last_error").notNull(),
    occurrences: integer("occurrences").notNull().default(1),
    firstSeenAt: timestamp("first_seen_at", { withTimezone: true }).notNull().defaultNow(),
    lastSeenAt: timestamp("last_seen_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.deadLetterId, t.payloadSha256] }),
    check("dead_letter_payloads_encoding_valid", sql`${t.payloadEncoding} in ('utf8', 'base64')`),
    check(
      "dead_letter_payloads_last_error_bounded",
      sql`char_length(${t.lastError}) <= ${sql.raw(String(LAST_ERROR_MAX))}`,
    ),
  ],
);

/**
 * The pending letters' keys, kept by triggers on core.dead_letters (migration
 * 0014): one row per (job_id, consumer) with a `pending_review` letter. The
 * fence's pending-letter check (`core.pending_letter`) reads this table, not
 * core.dead_letters, so a work transaction holds no lock on the letters'
 * table for its handler run and a migration of it never waits on live jobs
 * (#18 item 6). A replay or a discard changing a letter's status deletes its
 * key in the same transaction, so the check's FOR SHARE still waits for it.
 */
export const pendingLetterKeys = core.table(
  "pending_letter_keys",
  {
    jobId: text("job_id").notNull(),
    consumer: text("consumer").notNull(),
    deadLetterId: uuid("dead_letter_id")
      .notNull()
      .references(() => deadLetters.id, { onDelete: "cascade" }),
    errorClass: text("error_class").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.jobId, t.consumer] }),
    index("pending_letter_keys_dead_letter_id").on(t.deadLetterId),
  ],
);

/**
 * How far the fence TTL cleanup has deleted, per consumer: a fence of the
 * consumer written before `cleaned_before` may be gone. Written by the
 * cleanup in the statement (or the transaction) that deletes or detaches,
 * with the cutoff that statement used, so it commits with what it deleted.
 * A replayed letter's outcome is read from its job's fence; once its replay
 * is older than this, no fence no longer means "never ran", and the letter
 * is never replayed again (`core.ops_reclaim_letter`, migration 0032).
 */
export const fenceHorizons = core.table("fence_horizons", {
  consumer: text("consumer").primaryKey(),
  cleanedBefore: timestamp("cleaned_before", { withTimezone: true }).notNull(),
});

export type DeadLetterPayloadRow = typeof deadLetterPayloads.$inferSelect;
export type DeadLetterRow = typeof deadLetters.$inferSelect;
export type ProcessedJobRow = typeof processedJobs.$inferSelect;

export const REPLAY_BATCH_STATUSES = [
  "awaiting_approval",
  "ready",
  "running",
  "paused",
  "completed",
  "stopped",
  "expired",
] as const;
export type ReplayBatchStatus = (typeof REPLAY_BATCH_STATUSES)[number];

/** Which dead letters a batch takes; stored as the batch's `filter`. */
export interface DeadLetterFilterValue {
  queue?: string;
  consumer?: string;
  tenantId?: string;
  kind?: string;
  errorClass?: DeadLetterErrorClass;
  createdAfter?: string;
  createdBefore?: string;
}

/**
 * A bulk replay: which letters (selected once, at creation, into
 * replay_batch_items), who asked and who approved, how fast, and how it ended.
 */
export const replayBatches = core.table(
  "replay_batches",
  {
    id: uuid("id").primaryKey(),
    status: text("status").$type<ReplayBatchStatus>().notNull(),
    filter: jsonb("filter").$type<DeadLetterFilterValue>().notNull(),
    requestedBy: text("requested_by").notNull(),
    reason: text("reason").notNull(),
    approvedBy: text("approved_by"),
    approvedAt: timestamp("approved_at", { withTimezone: true }),
    /** Replays per second; with `rateShare`, the ceiling of the paced rate. */
    ratePerSecond: doublePrecision("rate_per_second").notNull(),
    /**
     * Pacing as a share of the consumers' live throughput (#21 item 5): the
     * rate is this share of the fences they wrote over the last minute
     * (replays' own left out), between `rateFloor` and `ratePerSecond`,
     * re-evaluated at every chunk. Null: the fixed `ratePerSecond`.
     */
    rateShare: doublePrecision("rate_share"),
    rateFloor: doublePrecision("rate_floor"),
    batchSize: integer("batch_size").notNull(),
    sampleSize: integer("sample_size"),
    maxFailureRate: doublePrecision("max_failure_rate").notNull(),
    expiresAt: timestamp("expires_at", { withTimezone: true }).notNull(),
    selected: integer("selected").notNull(),
    replayed: integer("replayed").notNull().default(0),
    skipped: integer("skipped").notNull().default(0),
    failedAgain: integer("failed_again").notNull().default(0),
    /** Replayed jobs whose fence the runner found (they succeeded); kept incrementally, like `failedAgain`. */
    succeeded: integer("succeeded").notNull().default(0),
    /** Replayed jobs resolved since `rateWindowStart`: what the failure-rate pause compares. */
    windowSucceeded: integer("window_succeeded").notNull().default(0),
    windowFailedAgain: integer("window_failed_again").notNull().default(0),
    /**
     * Replayed jobs whose fence was there before the replay (#21 item 5): the
     * work had been done, so the letter should not have been replayed (the
     * selection is wrong, or a fix already ran). Kept like `succeeded`.
     */
    duplicates: integer("duplicates").notNull().default(0),
    windowDuplicates: integer("window_duplicates").notNull().default(0),
    /** Pause when more than this share of the resolved replays since `rateWindowStart` were duplicates. */
    maxDuplicateRate: doublePrecision("max_duplicate_rate").notNull().default(0.5),
    /** Pause when its consumers' rate-limited share during the batch passes this multiple of the baseline (#21 item 5). */
    maxRateLimitedMultiple: doublePrecision("max_rate_limited_multiple").notNull().default(3),
    /** Pause when its consumers' handler p95 during the batch passes this multiple of the baseline (#21 item 5). */
    maxLatencyMultiple: doublePrecision("max_latency_multiple").notNull().default(3),
    /** When the runner last resolved a replayed job: with `startedAt`, the batch's time to recovery. */
    lastResolvedAt: timestamp("last_resolved_at", { withTimezone: true }),
    samplePassedAt: timestamp("sample_passed_at", { withTimezone: true }),
    /** Failure-rate checks count only jobs replayed since this time (set on start and on each resume). */
    rateWindowStart: timestamp("rate_window_start", { withTimezone: true }),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    startedAt: timestamp("started_at", { withTimezone: true }),
    endedAt: timestamp("ended_at", { withTimezone: true }),
    stopReason: text("stop_reason"),
    /** Who runs the batch now, until when: one runner at a time keeps the rate limit. */
    leaseOwner: text("lease_owner"),
    leaseExpiresAt: timestamp("lease_expires_at", { withTimezone: true }),
    /**
     * The versions of the batch's consumers when it was made (what its
     * approver approved), by "queue consumer": `{ version, kinds }`; null
     * when none had reported one (#21 item 6).
     */
    consumerVersions: jsonb("consumer_versions").$type<Record<string, { version: string; kinds: string[] }>>(),
  },
  (t) => [
    check("replay_batches_status_valid", sql`${t.status} in (${inList(REPLAY_BATCH_STATUSES)})`),
    check("replay_batches_reason_given", sql`btrim(${t.reason}) <> ''`),
    check("replay_batches_requester_given", sql`btrim(${t.requestedBy}) <> ''`),
    check("replay_batches_approver_not_requester", sql`${t.approvedBy} is null or ${t.approvedBy} <> ${t.requestedBy}`),
    check("replay_batches_rate_positive", sql`${t.ratePerSecond} > 0`),
    check(
      "replay_batches_rate_share_range",
      sql`(${t.rateShare} is null and ${t.rateFloor} is null) or (${t.rateShare} > 0 and ${t.rateShare} <= 1 and ${t.rateFloor} > 0 and ${t.rateFloor} <= ${t.ratePerSecond})`,
    ),
    check("replay_batches_batch_size_positive", sql`${t.batchSize} > 0`),
    check("replay_batches_sample_size_positive", sql`${t.sampleSize} is null or ${t.sampleSize} > 0`),
    check("replay_batches_failure_rate_range", sql`${t.maxFailureRate} > 0 and ${t.maxFailureRate} <= 1`),
    check("replay_batches_duplicate_rate_range", sql`${t.maxDuplicateRate} > 0 and ${t.maxDuplicateRate} <= 1`),
    check(
      "replay_batches_strain_multiples_range",
      sql`${t.maxRateLimitedMultiple} >= 1 and ${t.maxRateLimitedMultiple} <= 100 and ${t.maxLatencyMultiple} >= 1 and ${t.maxLatencyMultiple} <= 100`,
    ),
    index("replay_batches_status_idx").on(t.status, t.createdAt),
    // What one requester asked to replay over the approval window (#10 item 4).
    index("replay_batches_requester_idx").on(t.requestedBy, t.createdAt),
  ],
);

export const REPLAY_ITEM_STATES = ["pending", "replayed", "skipped"] as const;
export type ReplayItemState = (typeof REPLAY_ITEM_STATES)[number];
export const REPLAY_ITEM_RESOLUTIONS = ["succeeded", "failed_again", "duplicate"] as const;
export type ReplayItemResolution = (typeof REPLAY_ITEM_RESOLUTIONS)[number];

/** The letters a batch selected, in replay order. `skipped`: no longer pending when its turn came. */
export const replayBatchItems = core.table(
  "replay_batch_items",
  {
    batchId: uuid("batch_id")
      .notNull()
      .references(() => replayBatches.id, { onDelete: "cascade" }),
    deadLetterId: uuid("dead_letter_id")
      .notNull()
      .references(() => deadLetters.id),
    position: integer("position").notNull(),
    state: text("state").$type<ReplayItemState>().notNull().default("pending"),
    inSample: boolean("in_sample").notNull().default(false),
    replayedAt: timestamp("replayed_at", { withTimezone: true }),
    /** What became of the replayed job, once the runner found out (final: a fenced job cannot fail again). */
    resolution: text("resolution").$type<ReplayItemResolution>(),
  },
  (t) => [
    primaryKey({ columns: [t.batchId, t.deadLetterId] }),
    index("replay_batch_items_order_idx").on(t.batchId, t.state, t.position),
    // The runner resolves a bounded page of these per step (#10 item 10).
    index("replay_batch_items_unresolved_idx")
      .on(t.batchId, t.replayedAt)
      .where(sql`${t.state} = 'replayed' and ${t.resolution} is null`),
    check(
      "replay_batch_items_resolution_valid",
      sql`${t.resolution} is null or ${t.resolution} in (${inList(REPLAY_ITEM_RESOLUTIONS)})`,
    ),
    check("replay_batch_items_state_valid", sql`${t.state} in (${inList(REPLAY_ITEM_STATES)})`),
  ],
);

/** Every operator action on dead letters and batches, including refused ones. */
export const opsAudit = core.table(
  "ops_audit",
  {
    id: uuid("id").primaryKey(),
    at: timestamp("at", { withTimezone: true }).notNull().defaultNow(),
    operator: text("operator").notNull(),
    action: text("action").notNull(),
    scope: jsonb("scope").notNull(),
    result: text("result").$type<"ok" | "rejected" | "refused" | "error">().notNull(),
    detail: text("detail"),
  },
  (t) => [
    index("ops_audit_at_idx").on(t.at),
    // A letter's history: the entries naming it among their ids, or naming its batch (#9 item 13).
    index("ops_audit_scope_ids_idx").using("gin", sql`(${t.scope} -> 'ids')`),
    index("ops_audit_scope_batch_idx").on(sql`(${t.scope} ->> 'batchId')`),
    check("ops_audit_result_valid", sql`${t.result} in ('ok', 'rejected', 'refused', 'error')`),
  ],
);

export type ReplayBatchRow = typeof replayBatches.$inferSelect;
export type OpsAuditRow = typeof opsAudit.$inferSelect;

/**
 * Alert coalescing shared by every process on the database (SPEC §4
 * "Alerts"): one row per coalescing key (queue, consumer, error class, error
 * fingerprint). The occurrence that opens a window sends the alert; the
 * others in the window only count (`unreported`), and their count is reported
 * once — by the summary at the window's end, or else by the next window's
 * first alert (`previous_unreported`). See `src/alerts/windows.ts`.
 */
export const alertWindows = core.table(
  "alert_windows",
  {
    /** sha256 of queue, consumer, error class and fingerprint. */
    key: text("key").primaryKey(),
    queue: text("queue").notNull(),
    consumer: text("consumer").notNull(),
    errorClass: text("error_class").$type<DeadLetterErrorClass>().notNull(),
    errorFingerprint: text("error_fingerprint").notNull(),
    /** Increases by one each time a window opens: a summary names the window it reports. */
    windowNumber: integer("window_number").notNull().default(1),
    windowStartedAt: timestamp("window_started_at", { withTimezone: true }).notNull(),
    /** The dead letter whose alert opened the window. */
    firstDeadLetterId: text("first_dead_letter_id").notNull(),
    /** Occurrences in this window that were coalesced and not yet reported. */
    unreported: integer("unreported").notNull().default(0),
    /** What the previous window left unreported when this one opened: its first alert carries it. */
    previousUnreported: integer("previous_unreported").notNull().default(0),
    previousWindowStartedAt: timestamp("previous_window_started_at", { withTimezone: true }),
    lastSeenAt: timestamp("last_seen_at", { withTimezone: true }).notNull(),
  },
  (t) => [check("alert_windows_unreported_nonnegative", sql`${t.unreported} >= 0 and ${t.previousUnreported} >= 0`)],
);

export type AlertWindowRow = typeof alertWindows.$inferSelect;

/**
 * The transactional outbox (SPEC §4, side effects outside the database): jobs
 * a handler (or any producer with a transaction) publishes *in* its
 * transaction. A row exists only if that transaction committed; the relay
 * (`@softcrum/core/outbox`) publishes it through a `QueuePort` afterwards and
 * marks it published. At least once: a relay that dies between publishing
 * and marking leaves the row to be published again, which the consumer's
 * fence makes harmless (the envelope keeps its job_id).
 */
export const outbox = core.table(
  "outbox",
  {
    /** uuidv7: rows are relayed in about the order they were written. */
    id: uuid("id").primaryKey(),
    queue: text("queue").notNull(),
    /** The envelope as JSON text, validated when it was written. */
    payload: text("payload").notNull(),
    /** The envelope's job_id and kind, for operators looking at a stuck row. */
    jobId: uuid("job_id").notNull(),
    kind: text("kind").notNull(),
    /** `PublishOptions.targetConsumer`; null for every consumer of the queue. */
    targetConsumer: text("target_consumer"),
    /** When the job should become deliverable (`delayMs` from the write); null for at once. */
    deliverAfter: timestamp("deliver_after", { withTimezone: true }),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    /** The relay takes the row no earlier than this: moved forward after each failed publish. */
    availableAt: timestamp("available_at", { withTimezone: true }).notNull().defaultNow(),
    /** Publishes tried by relays that reached a result (a relay that crashed does not count). */
    attempts: integer("attempts").notNull().default(0),
    lastError: text("last_error"),
    publishedAt: timestamp("published_at", { withTimezone: true }),
    /** The transport's id for the published message, when it gives one. */
    messageId: text("message_id"),
  },
  (t) => [
    // The relay's scan: only unpublished rows, due first.
    index("outbox_unpublished_idx").on(t.availableAt, t.id).where(sql`${t.publishedAt} is null`),
    // The prune of published rows, oldest first.
    index("outbox_published_idx").on(t.publishedAt).where(sql`${t.publishedAt} is not null`),
    check("outbox_attempts_nonnegative", sql`${t.attempts} >= 0`),
    check(
      "outbox_last_error_bounded",
      sql`${t.lastError} is null or char_length(${t.lastError}) <= ${sql.raw(String(LAST_ERROR_MAX))}`,
    ),
  ],
);

export type OutboxRow = typeof outbox.$inferSelect;

/**
 * Deliveries a transport kept without running the handler or spending an
 * attempt (#19): Vercel Queues counts every lease, so a deferral or a hop
 * whose successor the service did not say it stored (a 202, a failed send)
 * keeps the original on its lease, and its next delivery would look like a
 * spent attempt. The adapter records each such hold here and subtracts them
 * when the message comes back; `successor_seen_at` is set when the copy
 * republished from that delivery arrives, so the kept original then goes
 * without running (one live copy, not two). Pruned by the fence cleanup
 * (a hold older than the fence TTL is older than any message it counts).
 */
export const transportHolds = core.table(
  "transport_holds",
  {
    consumer: text("consumer").notNull(),
    /** sha256 of the message's identity on its transport (topic, id, send time). */
    messageKey: text("message_key").notNull(),
    /** The provider's delivery count of the delivery that was kept. */
    deliveryCount: integer("delivery_count").notNull(),
    heldAt: timestamp("held_at", { withTimezone: true }).notNull().defaultNow(),
    successorSeenAt: timestamp("successor_seen_at", { withTimezone: true }),
  },
  (t) => [
    primaryKey({ columns: [t.consumer, t.messageKey, t.deliveryCount] }),
    index("transport_holds_held_at_idx").on(t.heldAt),
  ],
);

/**
 * What each running consumer reports of itself (#21 item 6): the build or
 * deployment its composition root runs and the job kinds it accepts,
 * written at start (`reportConsumerVersions`). A replay batch records the
 * versions of its consumers when it is made (what its approver approved)
 * and will not run against another.
 */
export const consumerVersions = core.table(
  "consumer_versions",
  {
    queue: text("queue").notNull(),
    consumer: text("consumer").notNull(),
    version: text("version").notNull(),
    kinds: text("kinds").array().notNull().default(sql`'{}'::text[]`),
    reportedAt: timestamp("reported_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.queue, t.consumer] }),
    check("consumer_versions_version_given", sql`btrim(${t.version}) <> '' and char_length(${t.version}) <= 200`),
  ],
);

/**
 * The database's own record of every operator state change (#21 item 3),
 * written by triggers whatever the path (a `core.ops_*` function, the
 * schema's owner), never by a session: nobody can type, change or delete a
 * row but the audit prune. What changed, from what to what, and who — the
 * actor the row names and the login that made the change.
 */
export const opsChanges = core.table(
  "ops_changes",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    at: timestamp("at", { withTimezone: true }).notNull().defaultNow(),
    /** The login (`session_user`) that made the change. */
    login: text("login").notNull(),
    /** Who the changed row names (`status_changed_by`, `approved_by`, …). */
    actor: text("actor"),
    /** `dead_letter.status`, `replay_batch.status`, `replay_batch.approved`, `ops_audit.delete`. */
    change: text("change").notNull(),
    target: uuid("target"),
    fromState: text("from_state"),
    toState: text("to_state"),
    detail: text("detail"),
  },
  (t) => [index("ops_changes_at_idx").on(t.at), index("ops_changes_target_idx").on(t.target)],
);
