/**
 * The one statement that writes a dead letter. A letter folds copies of the
 * same bytes only (#18 item 4):
 * - keyed by (job_id, consumer) when the payload carried a valid job_id (at
 *   most one pending letter per job, the fence's rule); a copy of that job
 *   with other bytes is one more occurrence of the letter, and its payload is
 *   kept in `core.dead_letter_payloads`, once per distinct payload, in the
 *   same statement;
 * - keyed by (consumer, payload_sha256) otherwise: a missing or invalid
 *   job_id is evidence (it is in the payload), never an identity.
 * A copy that folds in replaces the letter's error, class and attempts only
 * when its handler ran more times: a copy past the budget after a lost ack,
 * or one expired on arrival, ran nothing, and its "unknown" or "too old"
 * must not erase the failure the letter records, nor lower its attempts.
 */
import { sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import type { DeadLetterErrorClass } from "./schema.ts";
import type { AnyPgDatabase, WorkTransaction } from "./types.ts";

export interface DeadLetterToWrite {
  /** A valid job id (UUID v7, lower case), or null. */
  readonly jobId: string | null;
  readonly queue: string;
  readonly consumer: string;
  readonly payload: string;
  readonly payloadEncoding: "utf8" | "base64";
  readonly payloadSha256: string;
  readonly attempts: number;
  readonly lastError: string;
  readonly errorClass: DeadLetterErrorClass;
  readonly tenantId: string | null;
  readonly correlationId: string | null;
  readonly kind: string | null;
}

/**
 * Inserts the letter or counts one more occurrence of the pending one; its id,
 * and whether it is new. Refused as a whole (nothing written) in a session
 * whose session_replication_role is replica (migration 0027's
 * core.pending_letter_keys_kept()): there the triggers that keep a letter's
 * pending-letter key and make its COMMIT durable do not fire.
 */
export async function upsertDeadLetter(
  executor: AnyPgDatabase | WorkTransaction,
  letter: DeadLetterToWrite,
): Promise<{ readonly id: string; readonly inserted: boolean }> {
  const l = letter;
  const conflict =
    l.jobId === null
      ? sql`(consumer, payload_sha256) where status = 'pending_review' and job_id is null`
      : sql`(job_id, consumer) where status = 'pending_review'`;
  const result = await executor.execute(sql`with letter as (
  insert into core.dead_letters as d (id, job_id, queue, consumer, payload, payload_encoding, payload_sha256,
    attempts, last_error, error_class, tenant_id, correlation_id, kind)
  values (${uuidv7()}, ${l.jobId}, ${l.queue}, ${l.consumer}, ${l.payload}, ${l.payloadEncoding}, ${l.payloadSha256},
    ${l.attempts}, ${l.lastError}, ${l.errorClass}, ${l.tenantId}, ${l.correlationId}, ${l.kind})
  on conflict ${conflict} do update set occurrences = d.occurrences + 1, last_seen_at = now(),
    last_error = case when excluded.attempts > d.attempts then excluded.last_error else d.last_error end,
    error_class = case when excluded.attempts > d.attempts then excluded.error_class else d.error_class end,
    attempts = greatest(d.attempts, excluded.attempts)
  returning d.id, (d.xmax = 0) as inserted, d.payload_sha256
), other_payload as (
  insert into core.dead_letter_payloads as p (dead_letter_id, payload_sha256, payload, payload_encoding, last_error)
  select letter.id, ${l.payloadSha256}, ${l.payload}, ${l.payloadEncoding}, ${l.lastError} from letter
  where not letter.inserted and letter.payload_sha256 is distinct from ${l.payloadSha256}
  on conflict (dead_letter_id, payload_sha256) do update set occurrences = p.occurrences + 1, last_seen_at = now(),
    last_error = excluded.last_error
  returning 1
)
select id, inserted, core.pending_letter_keys_kept() as keys_kept from letter`);
  const rows = (Array.isArray(result) ? result : ((result as { rows?: unknown[] }).rows ?? [])) as {
    id: string;
    inserted: boolean;
  }[];
  const [written] = rows;
  if (!written) throw new Error("dead letter insert returned no row"); // unreachable: upsert always returns one
  return written;
}
