/**
 * Small helpers of the dead-letter operations (moved out of operations.ts):
 * the filter as SQL, payload decoding, report and message shaping, and rows
 * of a raw query.
 */
import { eq, gte, lt, type SQL } from "drizzle-orm";
import { type DeadLetterRow, deadLetters } from "../db/schema.ts";
import { checkEnvelope, type Envelope } from "../envelope.ts";
import type { ParsedFilter } from "./filters.ts";
import type { ActionOutcome, ActionReport } from "./ops-types.ts";

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

export function formatWindow(ms: number): string {
  return ms % 3_600_000 === 0 ? `${ms / 3_600_000} h` : `${Math.round(ms / 60_000)} min`;
}

/** Why a letter is not pending, naming the batch (or operator) that replayed it. */
export function notPendingDetail(row: {
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
export function actedOnNothing(result: object): boolean {
  if (!("counts" in result) || !("results" in result)) return false;
  const { counts, results } = result as ActionReport;
  return results.length > 0 && !counts.replayed && !counts.discarded;
}

/** The operator to record for an action, even when the given one is invalid. */
export function operatorName(operator: unknown): string {
  return typeof operator === "string" && operator.trim() !== "" ? operator.trim().slice(0, 200) : "(none given)";
}

export function summarize(results: ActionReport["results"][number][]): ActionReport {
  const counts: Partial<Record<ActionOutcome, number>> = {};
  for (const r of results) counts[r.outcome] = (counts[r.outcome] ?? 0) + 1;
  return { results, counts };
}

/** postgres.js returns rows as an array, PGlite and node-postgres as `{ rows }`. */
export function rowsOf<T>(result: unknown): T[] {
  return (Array.isArray(result) ? result : ((result as { rows?: T[] }).rows ?? [])) as T[];
}
