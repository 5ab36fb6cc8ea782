/**
 * The dead-letter decision (SPEC §4): a letter is written only under the
 * job's fence key, so it is never written beside a fence, and a work
 * transaction of the same job waiting on that key finds it. Bounded like a
 * work transaction of its consumer, on the client and on the server.
 */
import { sql } from "drizzle-orm";
import { withinMs as bounded } from "../timers.ts";
import type { AnyPgDatabase, WorkTransaction } from "./types.ts";
import { DEFAULT_TIMEOUT_MS, serverTimeoutMs, WORK_ISOLATION_LEVEL } from "./work-transaction.ts";

/**
 * The dead-letter decision for a job that may have a fence, serialised with
 * its work transaction on the fence key: it inserts the fence row itself,
 * which waits for a work transaction of the same job still in flight. A
 * conflict means the job committed (a duplicate); otherwise `write` runs in
 * the same transaction, holding the key, and the probe row is removed before
 * commit, so no fence is left. A work transaction that was waiting on the key
 * then finds the letter in the check that follows its fence, and rolls back
 * without running its handler.
 */
export async function decideDeadLetter<T>(
  db: AnyPgDatabase,
  target: {
    readonly jobId: string;
    readonly consumer: string;
    /**
     * Bounds the decision on the server like a work transaction of the same
     * consumer (its probe waits on the fence key a copy in flight holds, at
     * most that copy's run): statement and idle timeouts of timeoutMs + 1 s,
     * never looser than the session's. @default 25 s
     */
    readonly timeoutMs?: number;
    /**
     * The client's bound, when the delivery has less than `timeoutMs` left
     * for the decision (its other stages outside the run share that budget).
     * @default timeoutMs
     */
    readonly withinMs?: number | undefined;
  },
  write: (tx: WorkTransaction) => Promise<T>,
  /**
   * Called with what `write` returned when the decision committed after it
   * was given up on: its COMMIT was already sent (a slow WAL flush, a
   * synchronous standby lagging), so the letter stands although the
   * decision rejected with DecisionTimeoutError.
   */
  late?: (value: T) => void,
): Promise<{ readonly status: "duplicate" } | { readonly status: "written"; readonly value: T }> {
  const timeoutMs = target.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const withinMs = Math.min(timeoutMs, target.withinMs ?? timeoutMs);
  const ms = serverTimeoutMs(timeoutMs);
  // Bounded on the client too, from asking for a connection on: a pool that
  // stays exhausted must not hold the delivery past its visibility timeout.
  // A decision given up on writes nothing later: it rolls back at its next
  // step, unless its COMMIT was already sent (then `late` hears of it).
  let gaveUp = false;
  const deciding = db.transaction(async (tx) => {
    if (gaveUp) throw new DecisionTimeoutError(timeoutMs, withinMs);
    await tx.execute(sql`select set_config('statement_timeout', (case when s > 0 and s < ${ms} then ceil(s) else ${ms} end)::bigint || 'ms', true),
  set_config('idle_in_transaction_session_timeout', (case when i > 0 and i < ${ms} then ceil(i) else ${ms} end)::bigint || 'ms', true),
  core.pending_letter_keys_kept()
  from (select extract(epoch from current_setting('statement_timeout')::interval) * 1000 as s,
    extract(epoch from current_setting('idle_in_transaction_session_timeout')::interval) * 1000 as i) as session_ms`);
    const probe = rowsOf(
      await tx.execute(
        sql`insert into core.processed_jobs (job_id, consumer) values (${target.jobId}, ${target.consumer}) on conflict do nothing returning 1`,
      ),
    );
    if (probe.length === 0) return { status: "duplicate" } as const;
    if (gaveUp) throw new DecisionTimeoutError(timeoutMs, withinMs);
    const value = await write(tx as unknown as WorkTransaction);
    await tx.execute(
      sql`delete from core.processed_jobs where job_id = ${target.jobId} and consumer = ${target.consumer}`,
    );
    if (gaveUp) throw new DecisionTimeoutError(timeoutMs, withinMs);
    return { status: "written", value } as const;
  }, decisionConfig());
  if (late !== undefined) {
    deciding.then((decided) => {
      if (gaveUp && decided.status === "written") late(decided.value);
    }, noop);
  }
  return bounded(deciding, withinMs, () => {
    gaveUp = true;
    return new DecisionTimeoutError(timeoutMs, withinMs);
  });
}

/** The dead-letter decision did not end within its consumer's `timeoutMs`. */
export class DecisionTimeoutError extends Error {
  constructor(timeoutMs: number, withinMs = timeoutMs) {
    const left = withinMs < timeoutMs ? `, all the delivery had left of it (${withinMs} ms)` : "";
    super(
      `the dead-letter decision did not end within timeoutMs (${timeoutMs} ms)${left}: given up on, it rolls back at its next step`,
    );
    this.name = "DecisionTimeoutError";
  }
}

/** Rows of a `tx.execute` result, whichever driver made it (postgres.js: an array; node-postgres/PGlite: `.rows`). */
function rowsOf<T>(result: unknown): T[] {
  if (Array.isArray(result)) return result as T[];
  const rows = (result as { rows?: unknown })?.rows;
  return Array.isArray(rows) ? (rows as T[]) : [];
}

/**
 * The decision reads the fence key after waiting on it: READ COMMITTED, like
 * the work transaction. Read when called: this module and the engine import
 * each other, so nothing of the engine is read while the modules load.
 */
function decisionConfig() {
  return { isolationLevel: WORK_ISOLATION_LEVEL } as const;
}

const noop = () => {};
