import {
  bigint,
  bigserial,
  index,
  integer,
  pgSchema,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

/** The notifications module owns the `notifications` schema; @softcrum/core owns `core`. */
export const notifications = pgSchema("notifications");

/**
 * A tenant's contacts: our store is the source of truth for who gets a blast
 * (SPEC §7); nothing here is ever synced to the provider's audiences.
 * Addresses are stored lowercased, so one person is one row per tenant.
 */
export const contacts = notifications.table(
  "contacts",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    tenantId: text("tenant_id").notNull(),
    email: text("email").notNull(),
    name: text("name"),
    /** Set when the contact opted out of marketing: later blasts leave them out. */
    unsubscribedAt: timestamp("unsubscribed_at", { withTimezone: true }),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex("contacts_tenant_email_idx").on(t.tenantId, t.email),
    // The snapshot reads a tenant's contacts in id order.
    index("contacts_tenant_id_idx").on(t.tenantId, t.id),
  ],
);

/**
 * One blast: its message and the size of its audience, fixed when it started.
 * Immutable once written: a chunk job's range means the same people for as
 * long as the blast exists.
 */
export const blasts = notifications.table("blasts", {
  /** A UUID v7 chosen by the caller: starting the same id again publishes the same chunk jobs. */
  id: uuid("id").primaryKey(),
  tenantId: text("tenant_id").notNull(),
  fromAddress: text("from_address").notNull(),
  subject: text("subject").notNull(),
  html: text("html"),
  text: text("text"),
  replyTo: text("reply_to"),
  /** Recipients per chunk job (at most the provider's 100 per batch request). */
  chunkSize: integer("chunk_size").notNull(),
  recipients: integer("recipients").notNull(),
  chunks: integer("chunks").notNull(),
  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
});

/**
 * The audience of a blast, copied from `contacts` when it started, numbered
 * 0..recipients-1 in contact order: chunk i is positions [i × chunkSize,
 * (i + 1) × chunkSize). Contacts added, removed or changed afterwards change
 * no chunk, so every delivery of a chunk sends the same request.
 */
export const blastRecipients = notifications.table(
  "blast_recipients",
  {
    blastId: uuid("blast_id")
      .notNull()
      .references(() => blasts.id, { onDelete: "cascade" }),
    position: integer("position").notNull(),
    contactId: bigint("contact_id", { mode: "number" }).notNull(),
    email: text("email").notNull(),
    name: text("name"),
    /** The provider's id of the e-mail sent to this recipient, once its chunk committed. */
    providerEmailId: text("provider_email_id"),
    sentAt: timestamp("sent_at", { withTimezone: true }),
  },
  (t) => [primaryKey({ columns: [t.blastId, t.position] })],
);

/** One row per chunk the provider accepted, written in the chunk job's work transaction (with its fence). */
export const blastChunkSends = notifications.table(
  "blast_chunk_sends",
  {
    blastId: uuid("blast_id")
      .notNull()
      .references(() => blasts.id, { onDelete: "cascade" }),
    chunk: integer("chunk").notNull(),
    jobId: uuid("job_id").notNull(),
    recipients: integer("recipients").notNull(),
    /** The harness's attempt that committed (1: the first run). */
    attempt: integer("attempt").notNull(),
    sentAt: timestamp("sent_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.blastId, t.chunk] })],
);

/** One row per single e-mail sent (the transactional lane), written with its job's fence. */
export const emailSends = notifications.table(
  "email_sends",
  {
    jobId: uuid("job_id").primaryKey(),
    tenantId: text("tenant_id").notNull(),
    /** The lane the job came on (`transactional`). */
    lane: text("lane").notNull(),
    toAddress: text("to_address").notNull(),
    subject: text("subject").notNull(),
    providerEmailId: text("provider_email_id").notNull(),
    sentAt: timestamp("sent_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [index("email_sends_tenant_idx").on(t.tenantId, t.sentAt)],
);
