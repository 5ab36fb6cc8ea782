/**
 * The chunk consumer of a blast (marketing lane): one request to Resend's
 * batch endpoint for the ≤100 recipients of one chunk, then a record of what
 * was sent, in the job's work transaction — the fence and the record commit
 * together. The provider call is outside the transaction's guarantee, so it
 * carries an idempotency key derived from the job_id: a chunk whose COMMIT
 * fails after Resend accepted it is retried, sends the same request under the
 * same key, and Resend answers as before without sending again. That only
 * holds if every delivery sends the same request, which is why a chunk is a
 * range of the blast's snapshot (blast.ts), never a live query of contacts.
 */
import { defineConsumer, PermanentError, type RetryPolicy } from "@softcrum/core";
import { and, asc, eq, gte, lt, sql } from "drizzle-orm";
import type { CreateBatchEmailOptions, Resend } from "resend";
import { z } from "zod";
import { BLAST_CHUNK_KIND } from "./chunk-job-id.ts";
import { EMAIL_MARKETING_QUEUE, type EmailLimitOptions, emailLimits } from "./email-lanes.ts";
import { sentOrThrow } from "./resend-results.ts";
import { blastChunkSends, blastRecipients, blasts } from "./schema.ts";

/** Resend's batch endpoint takes at most 100 e-mails a request. */
export const MAX_CHUNK_SIZE = 100;

export const blastChunkData = z.object({
  blastId: z.uuid({ version: "v7" }),
  chunk: z.number().int().min(0),
  /** The chunk's first position in the blast's snapshot. */
  firstPosition: z.number().int().min(0),
  /** How many recipients it has (its last position is firstPosition + count - 1). */
  count: z.number().int().min(1).max(MAX_CHUNK_SIZE),
});
export type BlastChunk = z.infer<typeof blastChunkData>;

/** The key Resend de-duplicates a chunk's request by: one per chunk job, the same on every delivery. */
export function blastChunkIdempotencyKey(jobId: string): string {
  return `blast-chunk/${jobId}`;
}

export interface BlastChunkOptions extends EmailLimitOptions {
  /** The real SDK's client (or anything with its `batch.send`). */
  readonly resend: Pick<Resend, "batch">;
  /** Only tests override it; production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
  /** Chunks wait while the `email` channel has more transactional jobs outstanding than this. @default 0 */
  readonly yieldAbove?: number;
}

export function createBlastChunkConsumer(options: BlastChunkOptions) {
  const { resend } = options;
  return defineConsumer({
    name: "notifications.blast-chunk",
    queue: EMAIL_MARKETING_QUEUE,
    kind: BLAST_CHUNK_KIND,
    schema: blastChunkData,
    limits: emailLimits(options),
    // Transactional first (SPEC §7): the harness defers a chunk while the channel's transactional backlog is above this.
    yieldAbove: options.yieldAbove ?? 0,
    ...(options.retry ? { retry: options.retry } : {}),
    async handle(data, { tx, envelope, attempt, signal }) {
      const [blast] = await tx.select().from(blasts).where(eq(blasts.id, data.blastId));
      // A job that names a blast we do not have, or another tenant's, will never become sendable.
      if (blast === undefined) throw new PermanentError(`blast ${data.blastId} does not exist`);
      if (blast.tenantId !== envelope.tenant_id) {
        throw new PermanentError(`blast ${data.blastId} is not tenant ${envelope.tenant_id}'s`);
      }
      const firstPosition = data.chunk * blast.chunkSize;
      const count = Math.min(blast.chunkSize, blast.recipients - firstPosition);
      if (data.firstPosition !== firstPosition || data.count !== count) {
        throw new PermanentError(
          `chunk ${data.chunk} of blast ${data.blastId} is positions ${firstPosition}+${count}, the job says ${data.firstPosition}+${data.count}`,
        );
      }
      const recipients = await tx
        .select({ position: blastRecipients.position, email: blastRecipients.email })
        .from(blastRecipients)
        .where(
          and(
            eq(blastRecipients.blastId, data.blastId),
            gte(blastRecipients.position, firstPosition),
            lt(blastRecipients.position, firstPosition + count),
          ),
        )
        .orderBy(asc(blastRecipients.position));
      if (recipients.length !== count) {
        throw new PermanentError(
          `blast ${data.blastId}'s snapshot has ${recipients.length} of chunk ${data.chunk}'s ${count} recipients`,
        );
      }
      const content = blastContent(blast);
      const tags = [
        { name: "blast_id", value: blast.id },
        { name: "chunk", value: String(data.chunk) },
      ];
      const emails = recipients.map(
        (r): CreateBatchEmailOptions => ({
          from: blast.fromAddress,
          to: [r.email],
          subject: blast.subject,
          ...(blast.replyTo !== null ? { replyTo: blast.replyTo } : {}),
          tags,
          ...content,
        }),
      );
      const result = await resend.batch.send(emails, {
        idempotencyKey: blastChunkIdempotencyKey(envelope.job_id),
        signal,
      });
      const sent = sentOrThrow(result, "POST /emails/batch").data;
      if (!Array.isArray(sent) || sent.length !== recipients.length) {
        throw new PermanentError(
          `Resend accepted chunk ${data.chunk} of blast ${data.blastId} with ${Array.isArray(sent) ? sent.length : "no"} ids for ${recipients.length} e-mails`,
        );
      }
      await tx.insert(blastChunkSends).values({
        blastId: data.blastId,
        chunk: data.chunk,
        jobId: envelope.job_id,
        recipients: recipients.length,
        attempt,
      });
      // The batch answers in request order: each recipient gets the id of its own e-mail.
      const ids = recipients.map((r, i) => ({ position: r.position, id: sent[i]?.id ?? null }));
      await tx.execute(sql`
        update ${blastRecipients} as r
           set provider_email_id = v.id, sent_at = now()
          from jsonb_to_recordset(${JSON.stringify(ids)}::jsonb) as v(position int, id text)
         where r.blast_id = ${data.blastId} and r.position = v.position`);
    },
  });
}

/** The blast's body as the SDK types it: html and/or text, at least one (checked when the blast started). */
function blastContent(blast: { readonly html: string | null; readonly text: string | null }) {
  if (blast.html !== null) return blast.text !== null ? { html: blast.html, text: blast.text } : { html: blast.html };
  if (blast.text !== null) return { text: blast.text };
  throw new PermanentError("the blast has neither html nor text");
}
