/**
 * Opens the work transaction, writes the fence in it, runs the handler's work
 * in the same transaction only when the fence is new, and proves the commit.
 *
 * Two ways to do that, same semantics:
 * - any Drizzle Postgres driver: `db.transaction()` and the same statements
 *   through `tx.execute`;
 * - postgres.js (production): the harness opens the transaction itself on a
 *   reserved connection, so that BEGIN, the ordering lock and the fence insert
 *   go out in one pipelined round trip, as server-prepared statements; the
 *   handler gets a Drizzle transaction on that connection whose queries are
 *   prepared too, as postgres.js does by default (Drizzle prepares only named
 *   queries). See docs/adr/0002-work-transaction-on-postgres-js.md.
 *
 * What it concludes, and from what (SPEC §4):
 * - the state of the connection is known only from the connection itself:
 *   after any failure it sends ROLLBACK and reads the answer; a connection
 *   that does not answer, or whose transaction state cannot be known, is
 *   destroyed, never released. The handler's error is never read for this.
 * - `committed` needs the transaction the fence was written in to be still
 *   open right before COMMIT, and COMMIT answering `COMMIT`. On postgres.js,
 *   patched (patches/postgres@3.4.9.patch) so that a reservation whose socket
 *   closed refuses every later query instead of running it on a reconnected
 *   session, "still open" is the transaction status of the socket's last
 *   ReadyForQuery; on other drivers, the same transaction id before COMMIT.
 * - a job that has a `pending_review` dead letter never runs its handler and
 *   never commits a fence: the dead-letter decision holds the fence key while
 *   it writes the letter (`decideDeadLetter`), and the fence insert itself
 *   looks for a pending letter once it is done waiting (FENCE_SQL,
 *   `core.pending_letter`).
 */
import { is, sql } from "drizzle-orm";
import type { PgDialect } from "drizzle-orm/pg-core";
import { PostgresJsSession, PostgresJsTransaction } from "drizzle-orm/postgres-js/session";
import type { AnyPgDatabase, WorkTransaction } from "../consumer.ts";

export interface FenceTarget {
  readonly jobId: string;
  readonly consumer: string;
  /** Serialise on this key (transaction-scoped advisory lock) before the fence. */
  readonly lockKey?: string | undefined;
  /**
   * Bound on the handler's run, in ms: the work gets an AbortSignal that fires
   * then, the transaction is abandoned and its connection destroyed; the same
   * bound is set on the server as the transaction's `statement_timeout` (a
   * backend stuck in a statement does not see its socket close).
   */
  readonly timeoutMs?: number;
}

/** Used when a target names no `timeoutMs`. */
const DEFAULT_TIMEOUT_MS = 25_000;

export type WorkOutcome =
  /** The fence was new, the work ran, and the commit is proven. */
  | { readonly status: "committed" }
  /** The fence already existed: nothing ran. */
  | { readonly status: "duplicate" }
  /** The job has a pending dead letter (written by a concurrent delivery): nothing was committed. */
  | { readonly status: "dead_lettered"; readonly deadLetterId: string; readonly errorClass: string };

export type RunInWorkTransaction = (
  target: FenceTarget,
  /** `run.signal` is the run's AbortSignal (made on first use). */
  work: (tx: WorkTransaction, run: { readonly signal: AbortSignal }) => Promise<void>,
) => Promise<WorkOutcome>;

export interface WorkTransactionOptions {
  /**
   * Send BEGIN, lock and fence (and the commit check and COMMIT) without
   * waiting for each answer. Turn off behind poolers that cannot take
   * pipelined queries (Supavisor in transaction mode, porsager/postgres #970). @default true
   */
  readonly pipeline?: boolean;
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
    super(`the handler did not finish within timeoutMs (${timeoutMs} ms); its transaction was rolled back`);
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

export function workTransactionFor(db: AnyPgDatabase, options: WorkTransactionOptions = {}): RunInWorkTransaction {
  return pipelinedPostgresJs(db, options.pipeline !== false) ?? viaDrizzleTransaction(db);
}

const LOCK_SQL = "select pg_advisory_xact_lock(hashtextextended($1, 0))";
/**
 * The fence. For a new row (RETURNING runs only for an inserted one),
 * `core.pending_letter` (migration 0012) returns the job's pending dead letter
 * ("<id> <class>"), else NULL: a pending letter — written before, or by a
 * dead-letter decision that held the fence key while this insert waited for
 * it — means the handler must not run (its outside effects would happen for a
 * job waiting for review) and nothing may commit: never a fence beside a
 * pending letter. The function is VOLATILE, so its query takes a fresh
 * snapshot after the insert is done waiting and sees a letter committed
 * meanwhile (the insert's own snapshot would not); FOR SHARE waits for a
 * replay that is changing the letter's status right now and reads what it
 * committed.
 * One row: new. A conflict (no row) is a duplicate: the job's fence committed,
 * so it has no pending letter.
 */
const FENCE_SQL = `insert into core.processed_jobs (job_id, consumer) values ($1, $2) on conflict do nothing
  returning core.pending_letter($1, $2) as detail`;

/**
 * BEGIN with the server-side bounds of the rest of the transaction: a
 * statement that runs too long, and a transaction left idle by a frozen
 * client, which would otherwise hold the fence key, and every redelivery
 * waiting on it, forever. One simple-protocol message (postgres.js sends a
 * query without parameters that way), so the bounds cost no planning and no
 * round trip; `timeout` comes from serverTimeout() (digits and "ms" only).
 */
function beginSql(timeout: string): string {
  return `begin; set local statement_timeout = '${timeout}'; set local idle_in_transaction_session_timeout = '${timeout}'`;
}

/** The outcome of a pending letter found with the fence (detail "<id> <class>"). */
function letterOutcome(detail: string): WorkOutcome {
  const [deadLetterId, errorClass] = detail.split(" ");
  return { status: "dead_lettered", deadLetterId: deadLetterId ?? "unknown", errorClass: errorClass ?? "unknown" };
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
 * The server-side bound of a run with this `timeoutMs`, as a Postgres
 * duration: a second later than the harness's own, so that normally the
 * harness aborts the run and rolls back on a live session; the server's
 * bound is the backstop for a client that is frozen or cut off.
 */
function serverTimeout(timeoutMs: number): string {
  const ms = Math.ceil(timeoutMs) + SERVER_GRACE_MS;
  // Spliced into beginSql's text: never anything but an integer.
  if (!Number.isSafeInteger(ms) || ms <= 0)
    throw new RangeError(`timeoutMs must be a positive number, got ${timeoutMs}`);
  return `${ms}ms`;
}
const SERVER_GRACE_MS = 1_000;

/**
 * The run's AbortSignal, made on first use: most handlers never read theirs,
 * and this runs per job (a class, so no closure is made per job).
 */
export class RunSignal {
  #controller: AbortController | undefined;
  get signal(): AbortSignal {
    return this.controller().signal;
  }
  controller(): AbortController {
    this.#controller ??= new AbortController();
    return this.#controller;
  }
}

/**
 * One timer for every bounded wait of a job (the connection, BEGIN and fence,
 * the handler, COMMIT), each bounded by the same `ms` from its own start:
 * `within()` restarts the timer (`refresh()`, no new timer per wait), and when
 * it fires, the wait in progress ends with what its `expired` returns, after
 * that has done what it must (destroy the connection, abort the run). Between
 * two waits nothing is pending, so a firing then does nothing. This runs
 * per job, so it makes no timer or race per wait (#8: ratio_raw).
 */
class Deadline {
  readonly #ms: number;
  #timer: NodeJS.Timeout | undefined;
  #expire: (() => void) | undefined;
  constructor(ms: number) {
    this.#ms = ms;
  }

  /** `work`'s result if it comes within `ms` from now; else `expired()` is called and its error thrown. */
  within<T>(work: Promise<T>, expired: () => Error): Promise<T> {
    if (this.#timer === undefined) this.#timer = setTimeout(fire, this.#ms, this);
    else this.#timer.refresh();
    return new Promise<T>((resolve, reject) => {
      this.#expire = () => reject(expired());
      work.then(
        (value) => {
          this.#expire = undefined;
          resolve(value);
        },
        (error: unknown) => {
          this.#expire = undefined;
          reject(error);
        },
      );
    });
  }

  /** Called by the timer. */
  fire(): void {
    const expire = this.#expire;
    this.#expire = undefined;
    expire?.();
  }

  /** No more waits: the timer goes. */
  end(): void {
    clearTimeout(this.#timer);
    this.#expire = undefined;
  }
}

function fire(deadline: Deadline): void {
  deadline.fire();
}

/**
 * Runs `work` with an AbortSignal that fires after the deadline's `ms`;
 * rejects with HandlerTimeoutError then, after `onTimeout()`.
 */
function bounded(
  deadline: Deadline,
  timeoutMs: number,
  work: (run: RunSignal) => Promise<void>,
  onTimeout: () => void,
): Promise<void> {
  const run = new RunSignal();
  return deadline.within(work(run), () => {
    const error = new HandlerTimeoutError(timeoutMs);
    run.controller().abort(error);
    onTimeout();
    return error;
  });
}

function viaDrizzleTransaction(db: AnyPgDatabase): RunInWorkTransaction {
  return async (target, work) => {
    let started = false;
    let outcome: WorkOutcome | undefined;
    try {
      return await db.transaction(async (tx) => {
        // The server-side bounds first, so that they bound the waits for the
        // ordering lock and the fence key too: this path has no client-side
        // bound on its start (the pipelined one has), and a lock held
        // elsewhere must defer the delivery, not hold it forever.
        const timeout = serverTimeout(target.timeoutMs ?? DEFAULT_TIMEOUT_MS);
        await tx.execute(
          sql`select set_config('statement_timeout', ${timeout}, true), set_config('idle_in_transaction_session_timeout', ${timeout}, true)`,
        );
        if (target.lockKey !== undefined) {
          await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${target.lockKey}, 0))`);
        }
        // ON CONFLICT DO NOTHING waits on a concurrent insert of the same key
        // and then sees the conflict: two parallel deliveries give one effect.
        // The same fence statement as the pipelined path (FENCE_SQL), plus the
        // transaction id the COMMIT check below compares with.
        const [fence] = rowsOf<{ inserted: number; detail: string | null; xid: string }>(
          await tx.execute(sql`with fence as (
  insert into core.processed_jobs (job_id, consumer) values (${target.jobId}, ${target.consumer}) on conflict do nothing
  returning core.pending_letter(${target.jobId}, ${target.consumer}) as detail
)
select (select count(*)::int from fence) as inserted, (select detail from fence) as detail, txid_current()::text as xid`),
        );
        if (fence?.detail) {
          outcome = letterOutcome(fence.detail);
          throw ROLL_BACK; // the fence must not commit
        }
        if (!fence || fence.inserted === 0) return { status: "duplicate" } as const;
        started = true;
        // The handler gets a view of tx that refuses every call once its run
        // is over, so a handler still running after its timeout cannot write
        // into whatever the connection does next. (Query builders it made
        // before the end and runs after it are not covered on this path.)
        let over = false;
        const view = new Proxy(tx, {
          get(target, property, receiver) {
            if (over) throw new WorkTransactionOverError();
            const value = Reflect.get(target, property, receiver);
            return typeof value === "function" ? value.bind(target) : value;
          },
        });
        const timeoutMs = target.timeoutMs ?? DEFAULT_TIMEOUT_MS;
        const deadline = new Deadline(timeoutMs);
        try {
          await bounded(deadline, timeoutMs, (signal) => work(view, signal), noop);
        } finally {
          over = true;
          deadline.end();
        }
        // Still the transaction the fence was written in (the handler did not
        // end it). Also raises on an aborted transaction (25P02): if the
        // handler caught the error of a failed statement, the job is retried
        // rather than acknowledged with nothing done.
        const [check] = rowsOf<{ xid: string | null }>(
          await tx.execute(sql`select txid_current_if_assigned()::text as xid`),
        );
        if (check?.xid !== fence.xid) {
          throw new UnprovenCommitError("the transaction the fence was written in was no longer open before COMMIT");
        }
        return { status: "committed" } as const;
      });
    } catch (error) {
      if (error === ROLL_BACK && outcome) return outcome;
      if (!started) throw new WorkNotStartedError(error);
      throw error;
    }
  };
}

const noop = () => {};
const ROLL_BACK = new Error("rolled back: the job has a pending dead letter");

/** Rows of a `tx.execute` result, whichever driver made it (postgres.js: an array; node-postgres/PGlite: `.rows`). */
function rowsOf<T>(result: unknown): T[] {
  if (Array.isArray(result)) return result as T[];
  const rows = (result as { rows?: unknown })?.rows;
  return Array.isArray(rows) ? (rows as T[]) : [];
}

/** The parts of a postgres.js client this uses. */
interface PgClient {
  reserve(): Promise<ReservedClient>;
  options?: { prepare?: boolean };
}
type Rows = unknown[] & { command?: string };
interface ReservedClient {
  unsafe(query: string, params?: unknown[], options?: { prepare?: boolean }): Promise<Rows>;
  release(): void;
  /** From patches/postgres@3.4.9.patch: destroys the connection (its socket), failing every query in flight. */
  terminate?: () => void;
  /**
   * From patches/postgres@3.4.9.patch: the transaction status of the last
   * ReadyForQuery ('I', 'T' or 'E'), null once the reservation's socket closed.
   */
  transactionStatus?: () => string | null;
}

/** Drizzle's internals this path needs: present on every PgDatabase at run time, not in its public types. */
interface DrizzleInternals {
  readonly dialect: PgDialect;
  readonly session: unknown;
  readonly $client?: unknown;
}

/** How long ROLLBACK may take before the connection is destroyed instead. */
const ROLLBACK_WAIT_MS = 5_000;

function pipelinedPostgresJs(db: AnyPgDatabase, pipeline: boolean): RunInWorkTransaction | undefined {
  const internals = db as unknown as DrizzleInternals;
  if (!is(internals.session, PostgresJsSession)) return undefined;
  const client = internals.$client as PgClient | undefined;
  if (typeof client?.reserve !== "function") return undefined;
  // A client made with `prepare: false` (e.g. behind a transaction-mode
  // pooler) must not get named statements from us either.
  const prepare = client.options?.prepare !== false;
  const session = internals.session as unknown as { readonly options?: object; readonly schema?: unknown };
  const sessionOptions = session.options ?? {};
  // The relational config ({ fullSchema, schema, tableNamesMap }) that makes `tx.query.*` work.
  const schema = session.schema;
  const { dialect } = internals;
  const generic = viaDrizzleTransaction(db);
  const Session = (prepare ? PreparedPostgresJsSession : PostgresJsSession) as unknown as new (
    ...args: AnyArgs
  ) => PostgresJsSession<never, never, never>;

  /** Sends the statements one after another (pipeline off) or all at once, and settles them all. */
  async function send(
    conn: ReservedClient,
    statements: readonly (readonly [string, (readonly unknown[])?])[],
  ): Promise<PromiseSettledResult<Rows>[]> {
    if (pipeline) {
      return Promise.allSettled(
        statements.map(([text, params]) =>
          conn.unsafe(text, params ? [...params] : [], params ? { prepare } : undefined),
        ),
      );
    }
    const settled: PromiseSettledResult<Rows>[] = [];
    for (const [text, params] of statements) {
      // After a failure the rest would only fail too ("transaction is aborted"),
      // or worse run outside the transaction.
      if (settled.some((s) => s.status === "rejected")) {
        settled.push({ status: "rejected", reason: new Error("not sent: an earlier statement failed") });
        continue;
      }
      try {
        settled.push({
          status: "fulfilled",
          value: await conn.unsafe(text, params ? [...params] : [], params ? { prepare } : undefined),
        });
      } catch (reason) {
        settled.push({ status: "rejected", reason });
      }
    }
    return settled;
  }

  /**
   * Ends the reservation. A connection goes back to the pool only when its
   * own answer to ROLLBACK says no transaction is left open on it.
   */
  async function finish(conn: ReservedClient, state: "idle" | "rollback" | "destroy"): Promise<void> {
    if (state === "rollback") {
      let timer: NodeJS.Timeout | undefined;
      const answered = await Promise.race([
        conn.unsafe("rollback").then(
          (rows) => rows.command === "ROLLBACK",
          () => false,
        ),
        new Promise<false>((resolve) => {
          timer = setTimeout(() => resolve(false), ROLLBACK_WAIT_MS);
        }),
      ]);
      clearTimeout(timer);
      state = answered ? "idle" : "destroy";
    }
    if (state === "destroy") destroy(conn);
    else conn.release();
  }

  let warnedUnpatched = false;

  // BEGIN's text for the last timeoutMs seen: consumers keep theirs, so it is
  // rarely made again.
  let beginFor = { timeoutMs: Number.NaN, text: "" };

  return async (target, work) => {
    const timeoutMs = target.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const deadline = new Deadline(timeoutMs);
    try {
      const conn = await reserveWithin(client, deadline, timeoutMs);
      if (typeof conn.transactionStatus !== "function" || typeof conn.terminate !== "function") {
        // postgres.js without patches/postgres@3.4.9.patch: a reservation cannot
        // tell a reconnected session from its own, so take the slower path,
        // which checks the transaction id before COMMIT.
        conn.release();
        if (!warnedUnpatched) {
          warnedUnpatched = true;
          process.emitWarning(
            "@softcrum/core: postgres.js is not patched (patches/postgres@3.4.9.patch); the work transaction runs through db.transaction(), slower and exposed to porsager/postgres #1208",
          );
        }
        deadline.end();
        return await generic(target, work);
      }
      if (beginFor.timeoutMs !== timeoutMs) {
        beginFor = { timeoutMs, text: beginSql(serverTimeout(timeoutMs)) };
      }
      return await runOn(conn, beginFor.text, deadline, timeoutMs, target, work);
    } finally {
      deadline.end();
    }
  };

  async function runOn(
    conn: ReservedClient,
    begin: string,
    deadline: Deadline,
    timeoutMs: number,
    target: FenceTarget,
    work: Parameters<RunInWorkTransaction>[1],
  ): Promise<WorkOutcome> {
    let state: "idle" | "rollback" | "destroy" = "rollback";
    try {
      let inserted: boolean;
      let letter: string | undefined;
      try {
        // Bounded like the handler: a lock held elsewhere (the ordering key,
        // the fence key of a copy still running) or a wedged connection must
        // not hold the delivery forever. Past the bound the connection's state
        // is unknown (a statement may still be waiting on the server), so it
        // is destroyed; the delivery is deferred, no attempt spent.
        const settled = await deadline.within(
          send(conn, [
            [begin],
            ...(target.lockKey === undefined ? [] : [[LOCK_SQL, [target.lockKey]] as const]),
            [FENCE_SQL, [target.jobId, target.consumer]],
          ]),
          () => {
            destroy(conn);
            return new StartTimeoutError(timeoutMs);
          },
        );
        for (const s of settled) if (s.status === "rejected") throw s.reason;
        const fenced = settled[settled.length - 1];
        if (fenced?.status !== "fulfilled") throw new Error("the fence insert did not answer");
        inserted = fenced.value.length > 0;
        letter = (fenced.value[0] as { detail?: string | null } | undefined)?.detail ?? undefined;
      } catch (error) {
        if (error instanceof StartTimeoutError) state = "destroy"; // already destroyed: nothing to roll back
        throw new WorkNotStartedError(error);
      }
      // A pending letter: nothing runs, the fence (if written) is rolled back.
      if (letter !== undefined) return letterOutcome(letter);
      if (!inserted) return { status: "duplicate" };

      // The handler's queries go through a gate that closes when its run is
      // over, before the harness sends COMMIT or ROLLBACK: a query it sends
      // later (a branch still running after another threw, a run past its
      // timeout) is refused, never run after our COMMIT/ROLLBACK outside the
      // transaction.
      const gate = { over: false };
      const txSession = new Session(new GatedSessionClient(conn, gate), dialect, schema, sessionOptions);
      const tx = new PostgresJsTransaction(dialect, txSession, schema as never) as unknown as WorkTransaction;
      try {
        await bounded(
          deadline,
          timeoutMs,
          (signal) => work(tx, signal),
          () => {
            // The handler may still be running and sending on this connection:
            // destroy it now, so nothing it sends later can run anywhere.
            gate.over = true;
            state = "destroy";
            destroy(conn);
          },
        );
      } finally {
        gate.over = true;
      }

      // The transaction the fence was written in is still open on this
      // socket: the patched reservation refuses to send once its socket
      // closed (no reconnected session), and the last ReadyForQuery says
      // 'T' (the handler did not end it with its own COMMIT or ROLLBACK).
      const status = conn.transactionStatus?.() ?? null;
      if (status !== "T" && status !== "E") {
        state = status === "I" ? "idle" : "destroy";
        throw new UnprovenCommitError(
          status === "I"
            ? "the handler ended the work transaction itself (COMMIT or ROLLBACK through tx)"
            : "the connection closed while the handler ran",
        );
      }
      let committed: Rows;
      try {
        committed = await deadline.within(
          conn.unsafe("commit", [], { prepare }),
          () => new UnprovenCommitError(`no answer to COMMIT within ${timeoutMs} ms`),
        );
      } catch (error) {
        // A lost COMMIT reply: the job may or may not have committed. Not a
        // success; the retry finds the fence if it did.
        state = "destroy";
        throw error;
      }
      state = "idle";
      // Postgres answers COMMIT of an aborted transaction with ROLLBACK, no
      // error: a statement failed and the handler caught its error. Nothing
      // was written, so the job must not be acknowledged as done.
      if (committed.command !== "COMMIT") {
        throw new Error(
          "the work transaction was rolled back: a statement failed inside it and the handler caught its error",
        );
      }
      return { status: "committed" };
    } finally {
      await finish(conn, state);
    }
  }
}

/**
 * A connection from the pool within the deadline, else WorkNotStartedError
 * (the delivery is deferred). A reservation that arrives after we gave up
 * goes straight back to the pool.
 */
async function reserveWithin(client: PgClient, deadline: Deadline, ms: number): Promise<ReservedClient> {
  let gaveUp = false;
  const reserving = client.reserve();
  try {
    return await deadline.within(reserving, () => {
      gaveUp = true;
      return new Error(`no database connection within ${ms} ms`);
    });
  } catch (error) {
    if (gaveUp) reserving.then((late) => late.release(), noop);
    throw new WorkNotStartedError(error);
  }
}

/** BEGIN, lock and fence did not all answer in time; the connection was destroyed. */
class StartTimeoutError extends Error {
  constructor(ms: number) {
    super(`BEGIN, the ordering lock and the fence did not answer within ${ms} ms`);
    this.name = "StartTimeoutError";
  }
}

function destroy(conn: ReservedClient): void {
  if (typeof conn.terminate === "function") {
    conn.terminate();
    return;
  }
  // Unpatched postgres.js has no way to destroy one reserved connection:
  // the session ends itself (the server closes the socket, the pool
  // reconnects that connection later). Never released with a transaction open.
  conn.unsafe("select pg_terminate_backend(pg_backend_pid())").catch(() => {});
}

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
  target: { readonly jobId: string; readonly consumer: string },
  write: (tx: WorkTransaction) => Promise<T>,
): Promise<{ readonly status: "duplicate" } | { readonly status: "written"; readonly value: T }> {
  return db.transaction(async (tx) => {
    const probe = rowsOf(
      await tx.execute(
        sql`insert into core.processed_jobs (job_id, consumer) values (${target.jobId}, ${target.consumer}) on conflict do nothing returning 1`,
      ),
    );
    if (probe.length === 0) return { status: "duplicate" } as const;
    const value = await write(tx as unknown as WorkTransaction);
    await tx.execute(
      sql`delete from core.processed_jobs where job_id = ${target.jobId} and consumer = ${target.consumer}`,
    );
    return { status: "written", value } as const;
  });
}

// biome-ignore lint/suspicious/noExplicitAny: Drizzle's session constructor and prepareQuery are generic over types this file does not know.
type AnyArgs = any[];
// biome-ignore lint/suspicious/noExplicitAny: see above.
const SessionBase = PostgresJsSession as unknown as new (...args: AnyArgs) => { prepareQuery(...args: AnyArgs): any };

/**
 * The handler's queries are server-prepared (postgres.js caches them per
 * connection by their text), where Drizzle only prepares queries given a name.
 */
class PreparedPostgresJsSession extends SessionBase {
  override prepareQuery(query: unknown, fields: unknown, name: string | undefined, ...rest: AnyArgs) {
    return super.prepareQuery(query, fields, name ?? "", ...rest);
  }
}

/**
 * What the handler's Drizzle session talks to: the reserved connection, plus
 * the `savepoint()` a nested `tx.transaction()` needs (a reserved postgres.js
 * connection has none).
 */
interface SessionClient {
  unsafe: ReservedClient["unsafe"];
  savepoint<T>(fn: (inner: SessionClient) => Promise<T>): Promise<T>;
}

/** A class, not an object literal: no functions are made per job. */
class GatedSessionClient implements SessionClient {
  #depth = 0;
  constructor(
    private readonly conn: ReservedClient,
    private readonly gate: { readonly over: boolean },
  ) {}

  // Returns postgres.js's own pending query: Drizzle calls .values() on it
  // before it runs. Drizzle calls this inside async functions, so the
  // refusal reaches the handler as a rejected query.
  unsafe(query: string, params?: unknown[], options?: { prepare?: boolean }): Promise<Rows> {
    if (this.gate.over) throw new WorkTransactionOverError();
    return this.conn.unsafe(query, params, options);
  }

  async savepoint<T>(fn: (inner: SessionClient) => Promise<T>): Promise<T> {
    if (this.gate.over) throw new WorkTransactionOverError();
    this.#depth += 1;
    const name = `softcrum_sp_${this.#depth}`;
    await this.conn.unsafe(`savepoint ${name}`);
    try {
      const result = await fn(this);
      await this.conn.unsafe(`release savepoint ${name}`);
      return result;
    } catch (error) {
      await this.conn.unsafe(`rollback to savepoint ${name}`);
      throw error;
    } finally {
      this.#depth -= 1;
    }
  }
}
