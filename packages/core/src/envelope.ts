import { uuidv7 } from "uuidv7";
import { z } from "zod";
import { InvalidEnvelopeError } from "./errors.ts";

/** Longest tenant_id, correlation_id and kind accepted, in characters. */
export const ENVELOPE_FIELD_MAX = 200;

const boundedText = z.string().min(1, "must be a non-empty string").max(ENVELOPE_FIELD_MAX);

/**
 * The wire shape of every job. `kind` carries the schema version
 * (`points.award.v2`): a new version is a new kind, so messages of the old one
 * stay valid while they drain. Unknown top-level keys are stripped rather than
 * refused, so a later envelope field does not poison older consumers.
 */
export const envelopeSchema = z.object({
  // Lowercased: the fence column is a uuid (always printed lowercase) and
  // dead letters, replays and cleanup compare job ids as text.
  job_id: z.uuid({ version: "v7", error: "must be a UUID version 7" }).transform((id) => id.toLowerCase()),
  tenant_id: boundedText,
  correlation_id: boundedText,
  kind: boundedText.regex(/^[A-Za-z0-9][A-Za-z0-9._:-]*$/, "must be letters, digits and . _ : -"),
  data: z.unknown().refine((value) => value !== undefined, "is required"),
});

export interface Envelope<TData = unknown> {
  readonly job_id: string;
  readonly tenant_id: string;
  readonly correlation_id: string;
  readonly kind: string;
  readonly data: TData;
}

export interface CreateEnvelopeInput<TData> {
  tenantId: string;
  kind: string;
  data: TData;
  /** @default the new job_id: the job starts its own correlation chain. */
  correlationId?: string;
  /**
   * A caller-chosen job id (must be UUID v7), for producers that need a re-run
   * to be a no-op (one job per tenant per tick).
   * @default a fresh uuidv7
   */
  jobId?: string;
}

/** Builds a validated envelope with a fresh uuidv7 job_id. Producers never hand-build envelopes. */
export function createEnvelope<TData>(input: CreateEnvelopeInput<TData>): Envelope<TData> {
  const jobId = input.jobId ?? uuidv7();
  return parseEnvelope({
    job_id: jobId,
    tenant_id: input.tenantId,
    correlation_id: input.correlationId ?? jobId,
    kind: input.kind,
    data: input.data,
  }) as Envelope<TData>;
}

export type EnvelopeCheck = { ok: true; envelope: Envelope } | { ok: false; issues: string[] };

/** Validates a value as an envelope without throwing. */
export function checkEnvelope(value: unknown): EnvelopeCheck {
  const envelope = wellFormed(value);
  if (envelope !== undefined) return { ok: true, envelope };
  const result = envelopeSchema.safeParse(value);
  if (result.success) return { ok: true, envelope: result.data as Envelope };
  return { ok: false, issues: formatIssues(result.error) };
}

const JOB_ID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$/;
const KIND = /^[A-Za-z0-9][A-Za-z0-9._:-]*$/;

/**
 * The envelope `envelopeSchema` would return for `value`, checked in plain
 * code, or undefined: then the schema decides, and says why. Every delivery
 * is checked, and nearly all are well formed: this costs the harness about a
 * fifth of what the schema's parse did (envelope.test.ts holds the two to
 * the same answer on generated input). Reads each field once and returns
 * what it read.
 */
function wellFormed(value: unknown): Envelope | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined;
  const { job_id, tenant_id, correlation_id, kind, data } = value as Record<string, unknown>;
  if (typeof job_id !== "string" || !JOB_ID.test(job_id)) return undefined;
  if (!boundedString(tenant_id) || !boundedString(correlation_id) || !boundedString(kind) || !KIND.test(kind)) {
    return undefined;
  }
  if (data === undefined) return undefined;
  return { job_id: job_id.toLowerCase(), tenant_id, correlation_id, kind, data };
}

function boundedString(value: unknown): value is string {
  return typeof value === "string" && value.length >= 1 && value.length <= ENVELOPE_FIELD_MAX;
}

/** Validates a value as an envelope; throws `InvalidEnvelopeError` listing every problem. */
export function parseEnvelope(value: unknown): Envelope {
  const check = checkEnvelope(value);
  if (!check.ok) throw new InvalidEnvelopeError(check.issues);
  return check.envelope;
}

/** `path: message` for each Zod issue; the root is called `envelope`. */
export function formatIssues(error: z.ZodError): string[] {
  return error.issues.map((issue) => `${issue.path.length > 0 ? issue.path.join(".") : "envelope"}: ${issue.message}`);
}

/** Whether `value` is a job id the envelope accepts (a UUID v7, any case). */
export function isJobId(value: unknown): value is string {
  return typeof value === "string" && envelopeSchema.shape.job_id.safeParse(value).success;
}

/** Milliseconds since the epoch encoded in a UUID v7 (its first 48 bits): when the job was created. */
export function jobCreatedAt(jobId: string): number {
  return Number.parseInt(jobId.replaceAll("-", "").slice(0, 12), 16);
}
