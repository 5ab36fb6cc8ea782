/**
 * How a work transaction ends (the engine's last step, for
 * `work-transaction.ts` and `batch.ts`): the proof that the fence's
 * transaction is still open, the durable COMMIT, and what a failure there
 * means — maybe committed, or nothing committed (`RolledBackAtCommitError`)
 * — then the connection released, rolled back or destroyed (`finish`).
 */
import type { Answer, DriverConnection, Statement } from "./driver.ts";
import { HandlerTimeoutError, RolledBackAtCommitError, UnprovenCommitError } from "./errors.ts";
import type { Deadline } from "./work-transaction.ts";

/**
 * Right before COMMIT, after the handler's last statement (its gate is
 * closed by then), the durable commit, so a COMMIT that carries a fence
 * answers only once its WAL is flushed, whatever the database, the role or
 * the handler set (`SET LOCAL synchronous_commit = off`, `set_config`, a
 * function). Every work transaction's COMMIT passes here: the one mechanism
 * for fences (migration 0029 dropped the per-row trigger that did it inside
 * COMMIT, which a handler's SET CONSTRAINTS … IMMEDIATE fired early anyway).
 *
 * COMMIT itself still runs code after anything sent before it: the pending
 * deferred triggers (an application table's may turn the setting off) and
 * the queries of WITH HOLD cursors. So first those run now: SET CONSTRAINTS
 * ALL IMMEDIATE fires every pending deferred trigger (a deferred
 * constraint's violation fails here instead of at COMMIT, the same outcome),
 * CLOSE ALL drops the cursors (a holdable one would also outlive the job on
 * the pooled connection). Then `off` becomes the session's own setting (its
 * reset value), or local; a stricter setting stays.
 *
 * Written out here, not as a function of the schema, so consumers keep
 * working on a schema migrations are still bringing up; every name and
 * operator qualified, so a handler's search_path cannot shadow them;
 * set_config runs only when the setting is off. A NULL value makes
 * set_config a RESET for the transaction (`SET LOCAL … TO DEFAULT`; guc.c's
 * "NULL for a reset request"): the session's own value (its reset value:
 * the configuration's, the role's or database's as the session started, or
 * its connection's) as the server holds it now, with nothing to look up. It
 * replaced a look-up in pg_show_all_settings() whose planning cost the
 * server about 50 µs per COMMIT, a fifth of its work for a one-row job.
 * That value (local if it is off too) is then set again explicitly: a reset
 * value keeps the configuration file as its source, and a reload the server
 * applies between the commit check and COMMIT (separate messages where the
 * transaction id proves the commit) would replace it; one set explicitly is
 * the transaction's own, and a reload leaves it.
 */
const SETTLE_SQL = "set constraints all immediate; close all";
const DURABLE_COMMIT_SQL = `case when pg_catalog.current_setting('synchronous_commit') operator(pg_catalog.=) 'off'
  then pg_catalog.set_config('synchronous_commit',
    case when pg_catalog.set_config('synchronous_commit', null, true) operator(pg_catalog.=) 'off' then 'local'
      else pg_catalog.current_setting('synchronous_commit') end, true) end`;
/** Where the status proves the commit: sent in COMMIT's own simple-protocol message, before it (no statement or round trip of its own). */
export const BEFORE_COMMIT_SQL = `${SETTLE_SQL}; select ${DURABLE_COMMIT_SQL}`;
/** Where the transaction id proves it: in the commit check, after the settling statements (sent one by one: PGlite takes one per query). */
const SETTLE: readonly Statement[] = [{ text: "set constraints all immediate" }, { text: "close all" }];
export const OPEN_XID_SQL = `select pg_catalog.pg_current_xact_id_if_assigned()::pg_catalog.text as xid, ${DURABLE_COMMIT_SQL}`;

/** How long ROLLBACK may take before the connection is destroyed instead. */
export const ROLLBACK_WAIT_MS = 5_000;

/** How a run's connection ends (`finish`): released as it is, after ROLLBACK, or destroyed. */
export type EndState = "idle" | "rollback" | "destroy";
export interface RunEnd {
  state: EndState;
  /** COMMIT went to the server: a failure after this may have committed (`commitWork`). */
  commitSent?: boolean;
}

/**
 * Proves that the transaction the fence was written in is still open, then
 * sends COMMIT and requires it to answer `COMMIT`; throws otherwise (the
 * delivery is retried: the fence decides whether the work committed).
 * `fenceXid` is the transaction id the fence's insert answered, on a driver
 * whose connections cannot report their transaction status.
 */
export async function commitWork(
  conn: DriverConnection,
  deadline: Deadline,
  timeoutMs: number,
  fenceXid: unknown,
  end: RunEnd,
): Promise<void> {
  if (conn.provesByStatus) {
    // The patched reservation refuses to send once its socket closed (no
    // reconnected session), and the last ReadyForQuery says 'T' (the
    // handler did not end it with its own COMMIT or ROLLBACK).
    const status = conn.transactionStatus();
    if (status !== "T" && status !== "E") {
      end.state = status === "I" ? "idle" : "destroy";
      throw new UnprovenCommitError(
        status === "I"
          ? "the handler ended the work transaction itself (COMMIT or ROLLBACK through tx)"
          : "the connection closed while the handler ran",
      );
    }
  } else {
    // Same transaction id. Also raises on an aborted transaction (25P02):
    // if the handler caught the error of a failed statement, the job is
    // retried rather than acknowledged with nothing done.
    const unanswered = () => {
      end.state = "destroy";
      conn.destroy();
      return new UnprovenCommitError(`no answer to the commit check within ${timeoutMs} ms`);
    };
    let open: Answer;
    try {
      for (const statement of SETTLE) await deadline.within(conn.query(statement), unanswered);
      open = await deadline.within(conn.query({ text: OPEN_XID_SQL }), unanswered);
    } catch (error) {
      // The server refused a statement (a deferred constraint the work
      // broke, fired by SET CONSTRAINTS; 25P02): the transaction is aborted
      // and COMMIT was not sent, so nothing committed (finish() rolls it back).
      throw answeredByServer(error) ? rolledBackBy(error) : error;
    }
    if (open[0]?.["xid"] !== fenceXid) {
      throw new UnprovenCommitError("the transaction the fence was written in was no longer open before COMMIT");
    }
  }
  // COMMIT is sent only within the budget: once it is spent the run is
  // over, and a COMMIT sent now would make an outcome nobody waits for.
  if (deadline.spent) throw new HandlerTimeoutError(timeoutMs);
  let committed: string | undefined;
  end.commitSent = true;
  try {
    committed = await deadline.within(
      conn.commit(conn.provesByStatus ? BEFORE_COMMIT_SQL : undefined),
      () => new UnprovenCommitError(`no answer to COMMIT within ${timeoutMs} ms`),
    );
  } catch (error) {
    // A statement before COMMIT failed (a deferred constraint the work
    // broke; 25P02: the handler caught the error of a failed statement, and
    // the transaction is aborted): the rest of the message did not run, and
    // the transaction is still open, failed. Nothing committed.
    // Ended here as COMMIT would have ended it (ROLLBACK): the connection
    // is idle after a RolledBackAtCommitError, as the batch expects.
    if (conn.provesByStatus && conn.transactionStatus() === "E") {
      end.state = (await rolledBack(conn)) ? "idle" : "destroy";
      throw rolledBackBy(error);
    }
    // A lost COMMIT reply: the job may or may not have committed. Not a
    // success; the retry finds the fence if it did.
    end.state = "destroy";
    throw error;
  }
  end.state = "idle";
  // Postgres answers COMMIT of an aborted transaction with ROLLBACK, no
  // error: a statement failed and the handler caught its error. Nothing
  // was written, so the job must not be acknowledged as done.
  if (committed !== "COMMIT") throw new RolledBackAtCommitError();
}

/**
 * Ends the connection's part in this run. It goes back to the pool only when
 * its own answer to ROLLBACK says no transaction is left open on it.
 */
export async function finish(conn: DriverConnection, state: EndState): Promise<void> {
  if (state === "rollback") state = (await rolledBack(conn)) ? "idle" : "destroy";
  if (state === "destroy") conn.destroy();
  else conn.release();
}

/**
 * An error the server answered with — a SQLSTATE and a severity, as every
 * driver's error for an ErrorResponse carries — not a lost or broken
 * connection (whose `code` is an errno name such as EPIPE).
 */
function answeredByServer(error: unknown): boolean {
  const { code, severity } = (error ?? {}) as { code?: unknown; severity?: unknown };
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && typeof severity === "string";
}

/**
 * Nothing committed; the error is the cause only when the server refused a
 * statement sent right before COMMIT (a deferred constraint of the work). A
 * 25P02, or no answer at all to a transaction already aborted, means an
 * earlier statement failed and the handler caught its error.
 */
function rolledBackBy(error: unknown): RolledBackAtCommitError {
  const refused = answeredByServer(error) && (error as { code?: unknown }).code !== "25P02";
  return new RolledBackAtCommitError(refused ? error : undefined);
}

/** Sends ROLLBACK; whether it answered `ROLLBACK` within ROLLBACK_WAIT_MS (the connection is idle then). */
async function rolledBack(conn: DriverConnection): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const answered = await Promise.race([
    conn.rollback().then(
      (command) => command === "ROLLBACK",
      () => false,
    ),
    new Promise<false>((resolve) => {
      timer = setTimeout(resolve, ROLLBACK_WAIT_MS, false);
    }),
  ]);
  clearTimeout(timer);
  return answered;
}
