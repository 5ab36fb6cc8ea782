/**
 * One e-mail to one person, on the transactional lane (a receipt, a password
 * reset): `POST /emails` through the SDK with an idempotency key derived from
 * the job_id, under the same Resend bucket as the blasts. What was sent is
 * recorded in the job's work transaction, with its fence.
 */
import { createEnvelope, defineConsumer, type Envelope, type QueuePort, type RetryPolicy } from "@softcrum/core";
import type { Resend } from "resend";
import { z } from "zod";
import { EMAIL_TRANSACTIONAL_QUEUE, type EmailLimitOptions, emailLimits } from "./email-lanes.ts";
import { InvalidEmailError, issuesOf } from "./errors.ts";
import { sentOrThrow } from "./resend-results.ts";
import { emailSends } from "./schema.ts";

export const TRANSACTIONAL_EMAIL_KIND = "notifications.email.v1";

export const transactionalEmailData = z
  .object({
    to: z.email().max(320),
    from: z.string().min(3).max(320),
    subject: z.string().min(1).max(998),
    html: z.string().min(1).max(500_000).optional(),
    text: z.string().min(1).max(500_000).optional(),
    replyTo: z.email().max(320).optional(),
  })
  .refine((m) => m.html !== undefined || m.text !== undefined, { message: "html or text is required", path: ["html"] });
export type TransactionalEmail = z.infer<typeof transactionalEmailData>;

export function transactionalEmailIdempotencyKey(jobId: string): string {
  return `email/${jobId}`;
}

export interface TransactionalEmailOptions extends EmailLimitOptions {
  /** The real SDK's client (or anything with its `emails.send`). */
  readonly resend: Pick<Resend, "emails">;
  /** Only tests override it; production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
}

export function createTransactionalEmailConsumer(options: TransactionalEmailOptions) {
  const { resend } = options;
  return defineConsumer({
    name: "notifications.transactional-email",
    queue: EMAIL_TRANSACTIONAL_QUEUE,
    kind: TRANSACTIONAL_EMAIL_KIND,
    schema: transactionalEmailData,
    limits: emailLimits(options),
    ...(options.retry ? { retry: options.retry } : {}),
    async handle(data, { tx, envelope, signal }) {
      const base = {
        from: data.from,
        to: [data.to],
        subject: data.subject,
        ...(data.replyTo !== undefined ? { replyTo: data.replyTo } : {}),
      };
      const content =
        data.html !== undefined
          ? { html: data.html, ...(data.text !== undefined ? { text: data.text } : {}) }
          : { text: data.text as string };
      const result = await resend.emails.send(
        { ...base, ...content },
        { idempotencyKey: transactionalEmailIdempotencyKey(envelope.job_id), signal },
      );
      const sent = sentOrThrow(result, "POST /emails");
      await tx.insert(emailSends).values({
        jobId: envelope.job_id,
        tenantId: envelope.tenant_id,
        lane: "transactional",
        toAddress: data.to,
        subject: data.subject,
        providerEmailId: sent.id,
      });
    },
  });
}

export interface SendTransactionalEmailInput extends TransactionalEmail {
  readonly tenantId: string;
  /** @default the new job's id */
  readonly correlationId?: string;
}

/**
 * Puts one e-mail on the transactional lane. Validated here, so a bad one is
 * an error for the caller, never a message; returns the job's envelope.
 */
export async function sendTransactionalEmail(queue: QueuePort, input: SendTransactionalEmailInput): Promise<Envelope> {
  const { tenantId, correlationId, ...email } = input;
  const parsed = transactionalEmailData.safeParse(email);
  if (!parsed.success) throw new InvalidEmailError(issuesOf(parsed.error));
  const data = parsed.data;
  const envelope = createEnvelope({
    tenantId,
    kind: TRANSACTIONAL_EMAIL_KIND,
    data,
    ...(correlationId !== undefined ? { correlationId } : {}),
  });
  await queue.publish(EMAIL_TRANSACTIONAL_QUEUE, envelope);
  return envelope;
}
