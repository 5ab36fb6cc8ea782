/**
 * The statements a batch sends of its own (`batch.ts`): its ordering locks,
 * its fences, the check of its jobs' pending dead letters, the removal of the
 * fences of jobs that do not commit, and the savepoints of its jobs. Kept
 * apart from the run so the SQL and the reasons for its shape read in one place.
 */
import { randomBytes } from "node:crypto";
import type { Statement } from "./driver.ts";

/** The locks of a batch's ordering keys, each once, in the order of their hash: batches never lock in a cycle. */
export const LOCKS_SQL = `select count(pg_advisory_xact_lock(h)) as locked from
  (select distinct hashtextextended(k, 0) as h from unnest($1::text[]) as k order by h) as keys`;
/**
 * The batch's fences, inserted in job-id order (no two batches wait on each
 * other's rows in a cycle). A new row's job has no effect yet, but may have
 * a pending dead letter: LETTERS_SQL below.
 */
const FENCES = `insert into core.processed_jobs (job_id, consumer, processed_at)
  select j, $2, clock_timestamp() from unnest($1::uuid[]) as j order by j
  on conflict do nothing returning job_id::text as job_id`;
export const FENCES_SQL = FENCES;
export const FENCES_XID_SQL = `${FENCES}, pg_current_xact_id()::text as xid`;
/**
 * The pending dead letters of the batch's jobs, the check FENCE_SQL's
 * `core.pending_letter` makes for one job (`work-transaction.ts`), made once
 * for the batch: a statement of its own, sent in the same round trip right
 * after the fences' insert, so under READ COMMITTED (pinned) its snapshot is
 * taken after the insert is done waiting for every fence key — later than
 * the function's, which sees each row's letter right after that row — and
 * sees a letter a dead-letter decision committed while it held a key. Per
 * row, the function cost the server about 7 µs (two statements in
 * PL/pgSQL); this is one index scan. `core.pending_letter_keys_kept()` is a
 * one-time filter, so it refuses a replica-role session even when no letter
 * matches (a batch of duplicates only is then deferred too; alone, it is
 * acknowledged). Only the keys of fences this transaction inserted are read:
 * a duplicate can have a pending poison letter (written without the fence
 * key).
 *
 * Two steps, so that a batch with no pending letter — nearly every batch —
 * takes no lock and sends no savepoint (the locking step in one round trip
 * cost a batch of 16 about a fifth of its opening):
 * - LETTERS_SQL, in the opening: which of the batch's new fences have a key
 *   committed as pending. Without FOR SHARE: the rows a locking read could
 *   return are among the rows this one returns (both read the keys visible
 *   to a snapshot taken after the insert; a locking read only drops a row
 *   whose change committed meanwhile, or reads its new version, and a key's
 *   job and consumer never change: it is inserted, deleted, or pointed at
 *   another letter of the same job), so no row means no letter, and the
 *   locking step is skipped.
 * - LOCKED_LETTERS_SQL, only when the first found one: the same read FOR
 *   SHARE, which waits for a replay changing a letter's status right now and
 *   reads what it committed (a replayed letter's job runs). Its locks go at
 *   once: it runs in a savepoint of its own, rolled back right after it in
 *   the same round trip (`lockedLetterCheck`). A job found with a pending
 *   letter is settled at the opening and never runs; kept until COMMIT, its
 *   key would make a discard or a replay of that letter wait for every other
 *   handler of the batch (in a job of its own, the transaction ends at
 *   once), and two such keys could deadlock with a bulk discard. A savepoint
 *   that locks nothing takes no transaction id.
 */
const LETTERS = `select k.job_id, k.dead_letter_id::text || ' ' || k.error_class as detail
  from core.pending_letter_keys k
  where core.pending_letter_keys_kept() and k.consumer = $2 and k.job_id = any($1::uuid[]::text[])
    and exists (select from core.processed_jobs p
      where p.job_id = k.job_id::uuid and p.consumer = k.consumer and p.xmin = pg_current_xact_id_if_assigned()::xid)`;
export const LETTERS_SQL = LETTERS;
export const LOCKED_LETTERS_SQL = `${LETTERS}
  for share of k`;
/** The fences of the batch's jobs that do not commit. */
export const UNFENCE_SQL = "delete from core.processed_jobs where consumer = $2 and job_id = any($1::uuid[])";
/**
 * The name of each job's savepoint: a handler that named it could release
 * its own and roll back to the previous job's, undoing that job's work while
 * its fence (written at the batch's opening) still commits. Drawn once per
 * process, so no handler names it by accident or by copying it from here.
 */
const SAVEPOINT_NAME = `softcrum_job_${randomBytes(8).toString("hex")}`;
export const SAVEPOINT = `savepoint ${SAVEPOINT_NAME}`;
export const RELEASE = `release savepoint ${SAVEPOINT_NAME}`;
export const ROLLBACK_TO = `rollback to savepoint ${SAVEPOINT_NAME}`;
const LETTERS_SAVEPOINT = `${SAVEPOINT_NAME}_letters`;
/** LOCKED_LETTERS_SQL between its savepoint and that savepoint's rollback and release: the answer is the second statement's. */
export function lockedLetterCheck(params: readonly unknown[]): Statement[] {
  return [
    { text: `savepoint ${LETTERS_SAVEPOINT}` },
    { text: LOCKED_LETTERS_SQL, params },
    { text: `rollback to savepoint ${LETTERS_SAVEPOINT}` },
    { text: `release savepoint ${LETTERS_SAVEPOINT}` },
  ];
}
