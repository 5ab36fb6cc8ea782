import { sql } from "drizzle-orm";
import { check, index, integer, pgSchema, primaryKey, text, timestamp, uniqueIndex, uuid } from "drizzle-orm/pg-core";

/** Everything of the job infrastructure lives in the `core` schema. */
export const core = pgSchema("core");

/**
 * The idempotency fence. One row per (job, consumer) that committed its work;
 * written inside the work transaction and nowhere else. `processed_at` is
 * indexed for the TTL cleanup.
 */
export const processedJobs = core.table(
  "processed_jobs",
  {
    jobId: uuid("job_id").notNull(),
    consumer: text("consumer").notNull(),
    processedAt: timestamp("processed_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.jobId, t.consumer] }), index("processed_jobs_processed_at_idx").on(t.processedAt)],
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
    /** Null only for poison payloads that carried no readable job_id; then it is the raw value, cut to 200 characters. */
    jobId: text("job_id"),
    queue: text("queue").notNull(),
    consumer: text("consumer").notNull(),
    payload: text("payload").notNull(),
    payloadEncoding: text("payload_encoding").notNull().default("utf8"),
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
  },
  (t) => [
    uniqueIndex("dead_letters_one_pending_per_job_consumer")
      .on(t.jobId, t.consumer)
      .where(sql`${t.status} = 'pending_review'`),
    index("dead_letters_status_created_idx").on(t.status, t.createdAt),
    index("dead_letters_queue_consumer_idx").on(t.queue, t.consumer, t.status),
    check("dead_letters_status_valid", sql`${t.status} in (${inList(DEAD_LETTER_STATUSES)})`),
    check("dead_letters_error_class_valid", sql`${t.errorClass} in (${inList(ERROR_CLASSES)})`),
    check("dead_letters_payload_encoding_valid", sql`${t.payloadEncoding} in ('utf8', 'base64')`),
    check("dead_letters_attempts_nonnegative", sql`${t.attempts} >= 0`),
    check("dead_letters_last_error_bounded", sql`char_length(${t.lastError}) <= ${sql.raw(String(LAST_ERROR_MAX))}`),
    check(
      "dead_letters_discard_needs_reason",
      sql`${t.status} <> 'discarded' or (${t.statusReason} is not null and btrim(${t.statusReason}) <> '')`,
    ),
    check(
      "dead_letters_status_change_recorded",
      sql`${t.status} = 'pending_review' or (${t.statusChangedAt} is not null and ${t.statusChangedBy} is not null and btrim(${t.statusChangedBy}) <> '')`,
    ),
  ],
);

export type DeadLetterRow = typeof deadLetters.$inferSelect;
export type ProcessedJobRow = typeof processedJobs.$inferSelect;
