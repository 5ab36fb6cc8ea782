/** What the work-transaction engine throws; the harness reads these to decide a delivery's outcome. */

/**
 * `value instanceof type`, false where asking throws: a handler may throw
 * anything, a Proxy whose prototype cannot be read included, and the harness
 * asks what it threw before it classifies it.
 */
export function isInstance<T>(value: unknown, type: abstract new (...args: never[]) => T): value is T {
  try {
    return value instanceof type;
  } catch {
    return false;
  }
}

/** Thrown when the handler never started: no connection, BEGIN, lock or fence failed. No attempt was spent. */
export class WorkNotStartedError extends Error {
  constructor(cause: unknown) {
    super(`the handler did not start: ${cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause)}`, {
      cause,
    });
    this.name = "WorkNotStartedError";
  }
}

/** The handler ran past its `timeoutMs`; its transaction was abandoned. Transient: the job is retried. */
export class HandlerTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(
      `the handler did not finish within timeoutMs (${timeoutMs} ms), the run's one budget from asking for a connection to COMMIT; its transaction was rolled back`,
    );
    this.name = "HandlerTimeoutError";
  }
}

/** The commit could not be proven to be this job's transaction; it is treated as a failure (the fence decides later). */
export class UnprovenCommitError extends Error {
  constructor(reason: string) {
    super(`the work transaction's commit is not proven: ${reason}`);
    this.name = "UnprovenCommitError";
  }
}

/**
 * Nothing of the work transaction committed, and the server said so: COMMIT
 * answered ROLLBACK (a statement of the work failed, its error caught or
 * never awaited), or a statement sent right before COMMIT failed (`cause`: a
 * deferred constraint the work broke, fired there). Classified by `cause`
 * when there is one, else transient: the job is retried. In a batch, which
 * job made it fail is not known: none is charged, each runs alone next time.
 */
export class RolledBackAtCommitError extends Error {
  constructor(cause?: unknown) {
    super(
      cause === undefined
        ? "the work transaction was rolled back: a statement failed inside it and the handler caught its error"
        : "the work transaction was rolled back: a statement right before COMMIT failed (a deferred constraint or trigger of the work)",
      cause === undefined ? undefined : { cause },
    );
    this.name = "RolledBackAtCommitError";
  }
}

/**
 * A handler sent COMMIT, ROLLBACK or the like through its `tx`: refused
 * before it is sent (`Gate`). The work transaction holds the job's fence (in
 * a batch, every job's): ended by the handler, the fence would commit without
 * the work that follows, or the work without the fence.
 */
export class TransactionControlError extends Error {
  constructor(statement: string) {
    super(
      `${statement.toUpperCase()} refused: a handler runs inside the work transaction that holds its job's fence (in a batch, every job's) and may not end it (nested tx.transaction() savepoints are fine)`,
    );
    this.name = "TransactionControlError";
  }
}

/** Thrown at a handler that sends a statement whose setting would outlive its work transaction (a plain `SET`, `RESET`). */
export class SessionSettingError extends Error {
  constructor(statement: string) {
    super(
      `${statement.toUpperCase()} refused: a setting made for the session outlives the work transaction on the pooled connection, into later jobs of any consumer; set it for the transaction with SET LOCAL (or set_config(name, value, true))`,
    );
    this.name = "SessionSettingError";
  }
}

/** Thrown at a handler that sends a query after its run ended (timed out, failed, or finished). */
export class WorkTransactionOverError extends Error {
  constructor() {
    super(
      "the work transaction is over (the handler finished, failed or timed out): nothing more can run in it; await every query before returning",
    );
    this.name = "WorkTransactionOverError";
  }
}

/**
 * The batched work transaction this job was part of was rolled back because
 * of another job of the batch (its handler ran past the batch's budget, or
 * the connection broke under it): this job's work was undone with it. No
 * attempt is spent — the job itself did not fail — so it is deferred like a
 * job whose handler never started.
 */
export class BatchAbortedError extends WorkNotStartedError {
  constructor(cause: unknown) {
    super(cause);
    this.message = `the batch this job ran in was rolled back, and its work with it, through no failure of its own: ${cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause)}`;
    this.name = "BatchAbortedError";
  }
}
