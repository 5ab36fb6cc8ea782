/**
 * Starting a blast (SPEC §7: e-mail blasts only through the provider's batch
 * endpoint, our store the source of truth for recipients).
 *
 * 1. Snapshot, once per blast id: the blast row and a numbered copy of the
 *    tenant's subscribed contacts are written in one transaction, the copy by
 *    one INSERT … SELECT inside Postgres — no recipient passes through this
 *    process, so memory is flat whatever the audience. Contacts added,
 *    removed or changed later change no chunk: a chunk is a range of
 *    positions in the snapshot and sends to the same people on every
 *    delivery, which is what lets Resend's idempotency key stand for it.
 * 2. Publish one chunk job per ≤100 recipients on the marketing lane, each
 *    job_id derived from (blast id, chunk) (`blastChunkJobId`). Starting the
 *    same blast again — a retried request, a crash halfway through
 *    publishing — finds the snapshot, publishes the same jobs, and the chunk
 *    consumer's fence applies each once. A chunk already recorded as sent
 *    is not published again: a start long after the first — past the fence
 *    cleanup's TTL, or Resend's 24 h idempotency window — sends nothing twice.
 *    Publishing is bounded by `concurrency`, not by the audience.
 */
import { type AnyPgDatabase, createEnvelope, describeError, publishUntilStored, type QueuePort } from "@softcrum/core";
import { eq, sql } from "drizzle-orm";
import { z } from "zod";
import { type BlastChunk, MAX_CHUNK_SIZE } from "./blast-chunk.ts";
import { BLAST_CHUNK_KIND, blastChunkJobId, checkBlastId } from "./chunk-job-id.ts";
import { EMAIL_MARKETING_QUEUE } from "./email-lanes.ts";
import { BlastConflictError, EmptyBlastError, InvalidBlastError, issuesOf } from "./errors.ts";
import { blastChunkSends, blastRecipients, blasts, contacts } from "./schema.ts";

export const blastMessage = z
  .object({
    from: z.string().min(3).max(320),
    subject: z.string().min(1).max(998),
    // 100 e-mails of this go in one request: bounded well under the provider's request size.
    html: z.string().min(1).max(200_000).optional(),
    text: z.string().min(1).max(200_000).optional(),
    replyTo: z.email().max(320).optional(),
  })
  .refine((m) => m.html !== undefined || m.text !== undefined, { message: "html or text is required", path: ["html"] });
export type BlastMessage = z.infer<typeof blastMessage>;

const startBlastInput = z.object({
  blastId: z.string(),
  tenantId: z.string().min(1).max(200),
  message: blastMessage,
});

export interface StartBlastInput {
  /** A UUID v7 the caller keeps (`newBlastId()`): starting the same id again publishes the same jobs. */
  readonly blastId: string;
  readonly tenantId: string;
  readonly message: BlastMessage;
}

export interface StartBlastOptions {
  /** Recipients per chunk job, 1..100; kept with the blast, so a later start uses the first one. @default 100 */
  readonly chunkSize?: number;
  /** Publishes in flight at once. @default 8 */
  readonly concurrency?: number;
  /** Tries of a publish the transport did not confirm stored (a Vercel 202). @default 3 */
  readonly publishTries?: number;
}

export interface BlastReport {
  readonly blastId: string;
  /** False when the blast had started before: its snapshot was kept, its jobs published again. */
  readonly created: boolean;
  readonly recipients: number;
  readonly chunks: number;
  /** Chunk jobs the transport says it stored. */
  readonly published: number;
  /** Chunks already sent (a start again after they were delivered): not published. */
  readonly alreadySent: number;
  /** Chunk jobs only accepted (a Vercel 202) after every try: start the blast again. */
  readonly unconfirmed: number;
  /** Chunk jobs whose publish failed: start the blast again (the others are no-ops then). */
  readonly failed: number;
  readonly failures: readonly { readonly chunk: number; readonly error: string }[];
}

export interface StartBlastDeps {
  readonly db: AnyPgDatabase;
  /** Where the chunk jobs go: the module's publisher. */
  readonly queue: QueuePort;
}

const MAX_FAILURES_KEPT = 20;

/**
 * Starts blast `blastId`, or starts it again: snapshots its audience the
 * first time, then publishes every chunk job. Throws `InvalidBlastError` for
 * bad input, `EmptyBlastError` for a tenant with no subscribed contact,
 * `BlastConflictError` for an id already started with another tenant or
 * message; nothing is written or published then.
 */
export async function startBlast(
  deps: StartBlastDeps,
  input: StartBlastInput,
  options: StartBlastOptions = {},
): Promise<BlastReport> {
  const parsed = startBlastInput.safeParse(input);
  if (!parsed.success) throw new InvalidBlastError(issuesOf(parsed.error));
  const blastId = checkBlastId(parsed.data.blastId);
  const { tenantId, message } = parsed.data;
  const chunkSize = bounded(options.chunkSize, MAX_CHUNK_SIZE, 1, MAX_CHUNK_SIZE, "chunkSize");
  const concurrency = bounded(options.concurrency, 8, 1, 256, "concurrency");
  const tries = bounded(options.publishTries, 3, 1, 10, "publishTries");

  const blast = await snapshotBlast(deps.db, { blastId, tenantId, message, chunkSize });
  // One small integer per chunk sent: bounded by the number of chunks, read once.
  const sent = blast.created
    ? new Set<number>()
    : new Set(
        (
          await deps.db
            .select({ chunk: blastChunkSends.chunk })
            .from(blastChunkSends)
            .where(eq(blastChunkSends.blastId, blastId))
        ).map((r) => r.chunk),
      );

  let published = 0;
  let unconfirmed = 0;
  let failed = 0;
  const failures: { chunk: number; error: string }[] = [];
  const publishChunk = async (chunk: number) => {
    try {
      const firstPosition = chunk * blast.chunkSize;
      const data: BlastChunk = {
        blastId,
        chunk,
        firstPosition,
        count: Math.min(blast.chunkSize, blast.recipients - firstPosition),
      };
      const envelope = createEnvelope({
        jobId: blastChunkJobId(blastId, chunk),
        tenantId,
        correlationId: blastId,
        kind: BLAST_CHUNK_KIND,
        data,
      });
      if (await publishUntilStored(deps.queue, EMAIL_MARKETING_QUEUE, envelope, tries)) published += 1;
      else unconfirmed += 1;
    } catch (error) {
      failed += 1;
      if (failures.length < MAX_FAILURES_KEPT) failures.push({ chunk, error: describeError(error) });
    }
  };
  let next = 0;
  const lane = async () => {
    while (next < blast.chunks) {
      const chunk = next++;
      if (!sent.has(chunk)) await publishChunk(chunk);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, blast.chunks) }, lane));
  return {
    blastId,
    created: blast.created,
    recipients: blast.recipients,
    chunks: blast.chunks,
    published,
    alreadySent: sent.size,
    unconfirmed,
    failed,
    failures,
  };
}

interface Snapshot {
  readonly created: boolean;
  readonly recipients: number;
  readonly chunks: number;
  readonly chunkSize: number;
}

/** The blast row and its audience's snapshot: written the first time, read (and checked against the input) after. */
async function snapshotBlast(
  db: AnyPgDatabase,
  input: { blastId: string; tenantId: string; message: BlastMessage; chunkSize: number },
): Promise<Snapshot> {
  const { blastId, tenantId, message, chunkSize } = input;
  const row = {
    id: blastId,
    tenantId,
    fromAddress: message.from,
    subject: message.subject,
    html: message.html ?? null,
    text: message.text ?? null,
    replyTo: message.replyTo ?? null,
  };
  return db.transaction(async (tx) => {
    // Two starts at once: the second waits on the first's key, then finds its blast.
    const inserted = await tx
      .insert(blasts)
      .values({ ...row, chunkSize, recipients: 0, chunks: 0 })
      .onConflictDoNothing({ target: blasts.id })
      .returning({ id: blasts.id });
    if (inserted.length === 0) {
      const [existing] = await tx.select().from(blasts).where(eq(blasts.id, blastId));
      if (existing === undefined) throw new Error(`blast ${blastId} conflicted on insert but cannot be read`);
      const differs = (Object.keys(row) as (keyof typeof row)[]).find((key) => existing[key] !== row[key]);
      if (differs !== undefined) throw new BlastConflictError(blastId, differs === "tenantId" ? "tenant" : "message");
      return {
        created: false,
        recipients: existing.recipients,
        chunks: existing.chunks,
        chunkSize: existing.chunkSize,
      };
    }
    const copied = await tx.execute(sql`
      with copied as (
        insert into ${blastRecipients} (blast_id, position, contact_id, email, name)
        select ${blastId}, (row_number() over (order by c.id) - 1)::int, c.id, c.email, c.name
          from ${contacts} as c
         where c.tenant_id = ${tenantId} and c.unsubscribed_at is null
        returning 1)
      select count(*)::int as n from copied`);
    const recipients = rowsOf<{ n: number }>(copied)[0]?.n ?? 0;
    // Thrown inside the transaction: the blast row goes with it.
    if (recipients === 0) throw new EmptyBlastError(tenantId, blastId);
    const chunks = Math.ceil(recipients / chunkSize);
    await tx.update(blasts).set({ recipients, chunks }).where(eq(blasts.id, blastId));
    return { created: true, recipients, chunks, chunkSize };
  });
}

/** The rows of a raw query, whichever driver ran it (postgres.js: an array; PGlite, node-postgres: `.rows`). */
function rowsOf<T>(result: unknown): T[] {
  if (Array.isArray(result)) return result as T[];
  const rows = (result as { rows?: unknown } | null)?.rows;
  return Array.isArray(rows) ? (rows as T[]) : [];
}

function bounded(value: number | undefined, fallback: number, min: number, max: number, what: string): number {
  const v = value ?? fallback;
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new InvalidBlastError([`${what}: must be an integer from ${min} to ${max}, got ${String(value)}`]);
  }
  return v;
}
