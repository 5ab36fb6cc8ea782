/**
 * The work-transaction engine: opens the work transaction, writes the fence in
 * it, runs the handler's work in the same transaction only when the fence is
 * new, and proves the commit. One engine for every driver: a driver
 * (`driver.ts`, one file each in `drivers/`) supplies only I/O; every rule
 * below is enforced here, once.
 *
 * What it guarantees, and how (SPEC §4):
 * - the whole run is bounded by the consumer's `timeoutMs`, one budget from
 *   asking for a connection to COMMIT's answer (one timer, `Deadline`): the
 *   connection, BEGIN + lock + fence, the handler and COMMIT share it, so
 *   time spent waiting is never given again. ROLLBACK after a failure has a
 *   fixed allowance of its own, and so does the dead-letter decision
 *   (`decideDeadLetter`): `runBoundMs` and `DECISION` are the parts of the
 *   sum a transport's visibility timeout is checked against. A connection
 *   given up on while it was busy is destroyed.
 * - the transaction's settings are the harness's own, whatever the database
 *   or role says: READ COMMITTED (the fence's pending-letter check must read
 *   a letter committed while its insert waited; a snapshot taken at the
 *   transaction's start would miss it), and server-side statement and
 *   idle-in-transaction bounds that follow `timeoutMs` but never loosen a
 *   tighter one the role or connection set.
 * - the handler's `tx` — and everything made from it: savepoints, prepared
 *   queries, query builders awaited later — reaches the connection only
 *   through a gate that closes before the engine sends COMMIT or ROLLBACK.
 * - the state of the connection is known only from the connection itself:
 *   after any failure the engine sends ROLLBACK and reads the answer; a
 *   connection that does not answer, or whose state cannot be known, is
 *   destroyed, never released. The handler's error is never read for this.
 * - `committed` needs the transaction the fence was written in to be still
 *   open right before COMMIT — the session's transaction status on a driver
 *   that reports it (patched postgres.js), else the same transaction id —
 *   and COMMIT answering `COMMIT`.
 * - a job that has a `pending_review` dead letter never runs its handler and
 *   never commits a fence: the dead-letter decision holds the fence key while
 *   it writes the letter (`decideDeadLetter`), and the fence insert itself
 *   looks for a pending letter once it is done waiting (FENCE_SQL,
 *   `core.pending_letter`).
 */
import { sql } from "drizzle-orm";
import { PgTransaction } from "drizzle-orm/pg-core";
import { InvalidConfigError } from "../errors.ts";
import { commitWork, finish, ROLLBACK_WAIT_MS, type RunEnd } from "./commit.ts";
import { type Answer, type Driver, type DriverConnection, Gate, type Opening, type Statement } from "./driver.ts";
import { nodePostgresDriver } from "./drivers/node-postgres.ts";
import { pgliteDriver } from "./drivers/pglite.ts";
import { postgresJsDriver } from "./drivers/postgres-js.ts";
import { HandlerTimeoutError, WorkNotStartedError } from "./errors.ts";
import type { AnyPgDatabase, WorkTransaction } from "./types.ts";

export { commitWork, type EndState, finish, ROLLBACK_WAIT_MS, type RunEnd } from "./commit.ts";
export {
  HandlerTimeoutError,
  RolledBackAtCommitError,
  UnprovenCommitError,
  WorkNotStartedError,
  WorkTransactionOverError,
} from "./errors.ts";

export interface FenceTarget {
  readonly jobId: string;
  readonly consumer: string;
  /** Serialise on this key (transaction-scoped advisory lock) before the fence. */
  readonly lockKey?: string | undefined;
  /**
   * The run's one budget, in ms, from asking for a connection to COMMIT's
   * answer: the handler's AbortSignal fires when it is spent, the transaction
   * is abandoned and its connection destroyed;
   * the same bound (plus a grace) is set on the server as the transaction's
   * `statement_timeout` (a backend stuck in a statement does not see its
   * socket close).
   */
  readonly timeoutMs?: number;
  /**
   * Batched consumers: run this job in a transaction of its own, never in a
   * batch. Set for a delivery that was deferred before (`Delivery.deferrals`):
   * a batch it ran in may have been undone through another job's fault, in
   * this process or in another one, and alone it is charged only for its own.
   */
  readonly alone?: boolean;
}

/** Used when a target names no `timeoutMs`. */
export const DEFAULT_TIMEOUT_MS = 25_000;

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
   * postgres.js: send BEGIN, lock and fence without waiting for each answer.
   * Turn off behind poolers that cannot take pipelined queries (Supavisor in
   * transaction mode, porsager/postgres #970). @default true
   */
  readonly pipeline?: boolean;
}

/** The isolation level of every work transaction and dead-letter decision, whatever the database default. */
export const WORK_ISOLATION_LEVEL = "read committed";

/** The driver of a Drizzle database; a clear error for one the engine has no driver for. */
export function driverFor(db: AnyPgDatabase, options: WorkTransactionOptions = {}): Driver {
  const driver =
    postgresJsDriver(db, { pipeline: options.pipeline !== false }) ?? nodePostgresDriver(db) ?? pgliteDriver(db);
  if (driver === undefined) {
    throw new InvalidConfigError(
      "the harness runs on a Drizzle database over postgres.js, node-postgres (a pg.Pool) or PGlite; this one is none of them",
    );
  }
  return driver;
}

export function workTransactionFor(db: AnyPgDatabase, options: WorkTransactionOptions = {}): RunInWorkTransaction {
  const driver = driverFor(db, options);
  return singleRunner(driver, new Openings());
}

/** One job per work transaction on `driver` (the batched runner's too, for a batch of one). */
export function singleRunner(driver: Driver, openings: Openings): RunInWorkTransaction {
  return async (target, work) => {
    const timeoutMs = target.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const deadline = new Deadline(timeoutMs);
    try {
      const conn = await acquireWithin(driver, deadline, timeoutMs);
      return await runOn(driver, conn, openings, deadline, timeoutMs, target, work);
    } finally {
      deadline.end();
    }
  };
}

const LOCK_SQL = "select pg_advisory_xact_lock(hashtextextended($1, 0))";
/**
 * The fence. For a new row (RETURNING runs only for an inserted one),
 * `core.pending_letter` (migrations 0012, 0014) returns the job's pending
 * dead letter ("<id> <class>"), else NULL, from `core.pending_letter_keys`,
 * which triggers on core.dead_letters keep: the work transaction takes no
 * lock on the letters' table, so a migration of it never waits on a job: a pending letter — written before, or by a
 * dead-letter decision that held the fence key while this insert waited for
 * it — means the handler must not run (its outside effects would happen for a
 * job waiting for review) and nothing may commit: never a fence beside a
 * pending letter. The function is VOLATILE, so under READ COMMITTED its query
 * takes a fresh snapshot after the insert is done waiting and sees a letter
 * committed meanwhile (the insert's own snapshot would not; under REPEATABLE
 * READ neither would the function's, hence the pinned isolation level); FOR
 * SHARE waits for a replay that is changing the letter's status right now
 * and reads what it committed. `processed_at` is the insert's own clock, not
 * the transaction's start. The transaction id is what the commit check of a
 * driver without a transaction status compares.
 * One row: new. A conflict (no row) is a duplicate: the job's fence committed,
 * so it has no pending letter.
 */
const FENCE_SQL = `insert into core.processed_jobs (job_id, consumer, processed_at) values ($1, $2, clock_timestamp()) on conflict do nothing
  returning core.pending_letter($1, $2) as detail`;
const FENCE_XID_SQL = `insert into core.processed_jobs (job_id, consumer, processed_at) values ($1, $2, clock_timestamp()) on conflict do nothing
  returning core.pending_letter($1, $2) as detail, pg_current_xact_id()::text as xid`;

/**
 * How a work transaction opens: at the harness's own isolation level,
 * whatever the database or role default, with server-side bounds on the rest
 * of the transaction, set before the ordering lock (so they bound its wait
 * too): a statement that runs too long, and a transaction left idle by a
 * frozen client, which would otherwise hold the fence key, and every
 * redelivery waiting on it, forever. Each bound is the run's own unless the
 * session already has a tighter one (the role's, the database's or the
 * connection's), which it keeps.
 *
 * The session's bounds are the same on every connection of one pool (one
 * role, one database, one set of connection options), so the first run
 * reads them with BOUNDS_SQL (which also sets this transaction's bounds),
 * and every later run sends its bounds as `set local` in BEGIN's own
 * simple-protocol message: no planning and no round trip of their own (a
 * statement of its own per job cost about a tenth of the harness's rate).
 */
export class Openings {
  /** The session's own bounds in ms (0: none), once a run has read them. */
  #session: { readonly statement: number; readonly idle: number } | undefined;
  #last: { readonly timeoutMs: number; readonly opening: Opening } | undefined;

  /** The opening for a run with this `timeoutMs`, or undefined while the session's bounds are unknown. */
  for(timeoutMs: number): Opening | undefined {
    const session = this.#session;
    if (session === undefined) return undefined;
    if (this.#last?.timeoutMs !== timeoutMs) {
      const ms = serverTimeoutMs(timeoutMs);
      const bounds = `set local statement_timeout = '${tighter(ms, session.statement)}ms'; set local idle_in_transaction_session_timeout = '${tighter(ms, session.idle)}ms'`;
      this.#last = {
        timeoutMs,
        opening: { begin: `${BEGIN}; ${bounds}`, inTransaction: `${SET_ISOLATION}; ${bounds}` },
      };
    }
    return this.#last.opening;
  }

  /** What BOUNDS_SQL answered on the first run. */
  learn(answer: Answer | undefined): void {
    const row = answer?.[0];
    const statement = Number(row?.["session_statement_ms"]);
    const idle = Number(row?.["session_idle_ms"]);
    if (Number.isFinite(statement) && Number.isFinite(idle)) this.#session = { statement, idle };
  }
}

const BEGIN = `begin isolation level ${WORK_ISOLATION_LEVEL}`;
const SET_ISOLATION = `set transaction isolation level ${WORK_ISOLATION_LEVEL}`;
const BARE_OPENING: Opening = { begin: BEGIN, inTransaction: SET_ISOLATION };

/** A bound of `ms` that keeps the session's own `sessionMs` when that is tighter (0 is none). */
function tighter(ms: number, sessionMs: number): number {
  return sessionMs > 0 && sessionMs < ms ? Math.ceil(sessionMs) : ms;
}

/** The first run's bounds, set on the server from the session's own (see Openings), which it also returns. */
const BOUNDS_SQL = `select set_config('statement_timeout', (case when s > 0 and s < $1 then ceil(s) else $1 end)::bigint || 'ms', true),
  set_config('idle_in_transaction_session_timeout', (case when i > 0 and i < $1 then ceil(i) else $1 end)::bigint || 'ms', true),
  s as session_statement_ms, i as session_idle_ms
  from (select extract(epoch from current_setting('statement_timeout')::interval) * 1000 as s,
    extract(epoch from current_setting('idle_in_transaction_session_timeout')::interval) * 1000 as i) as session_ms`;

/**
 * The server-side bound of a run with this `timeoutMs`, in ms: a second
 * later than the harness's own, so that normally the harness aborts the run
 * and rolls back on a live session; the server's bound is the backstop for a
 * client that is frozen or cut off.
 */
export function serverTimeoutMs(timeoutMs: number): number {
  const ms = Math.ceil(timeoutMs) + SERVER_GRACE_MS;
  if (!Number.isSafeInteger(ms) || ms <= 0)
    throw new RangeError(`timeoutMs must be a positive number, got ${timeoutMs}`);
  return ms;
}
const SERVER_GRACE_MS = 1_000;

/** The outcome of a pending letter found with the fence (detail "<id> <class>"). */
export function letterOutcome(detail: string): WorkOutcome {
  const [deadLetterId, errorClass] = detail.split(" ");
  return { status: "dead_lettered", deadLetterId: deadLetterId ?? "unknown", errorClass: errorClass ?? "unknown" };
}

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
 * The run's one budget: `ms` from when the run asks for a connection, shared
 * by every wait in it (the connection, BEGIN + lock + fence, the handler, the
 * commit check, COMMIT), so the whole work transaction ends within `ms`
 * whatever part of it waited — the bound a transport's visibility timeout is
 * checked against (`runBoundMs`). One timer per job, armed on the first wait;
 * when it fires, the wait in progress ends with what its `expired` returns,
 * after that has done what it must (destroy the connection, abort the run);
 * a wait that begins after it fired ends at once the same way. This runs per
 * job, so it makes no timer or race per wait (#8: ratio_raw).
 */
export class Deadline {
  readonly #ms: number;
  #timer: NodeJS.Timeout | undefined;
  #expire: (() => void) | undefined;
  #spent = false;
  constructor(ms: number) {
    this.#ms = ms;
  }

  /** `work`'s result if it comes before the budget is spent; else `expired()` is called and its error thrown. */
  within<T>(work: Promise<T>, expired: () => Error): Promise<T> {
    if (this.#timer === undefined) this.#timer = setTimeout(fire, this.#ms, this);
    return new Promise<T>((resolve, reject) => {
      if (this.#spent) {
        work.catch(noop);
        reject(expired());
        return;
      }
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

  /** The budget is spent: a wait started now ends at once. */
  get spent(): boolean {
    return this.#spent;
  }

  /** Called by the timer. */
  fire(): void {
    this.#spent = true;
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

const noop = () => {};

/**
 * The longest a work transaction with this `timeoutMs` can hold a delivery:
 * its one budget, then ROLLBACK's allowance after a failure.
 */
export function runBoundMs(timeoutMs: number): number {
  return timeoutMs + ROLLBACK_WAIT_MS;
}

/**
 * A connection within the deadline, else WorkNotStartedError (the delivery
 * is deferred). One that arrives after we gave up goes straight back.
 */
export async function acquireWithin(driver: Driver, deadline: Deadline, ms: number): Promise<DriverConnection> {
  let gaveUp = false;
  const acquiring = driver.acquire();
  try {
    return await deadline.within(acquiring, () => {
      gaveUp = true;
      return new Error(`no database connection within ${ms} ms`);
    });
  } catch (error) {
    if (gaveUp) acquiring.then((late) => late.release(), noop);
    throw new WorkNotStartedError(error);
  }
}

/** BEGIN, lock and fence did not all answer in time; the connection was destroyed. */
export class StartTimeoutError extends Error {
  constructor(ms: number) {
    super(`BEGIN, the ordering lock and the fence did not answer within ${ms} ms`);
    this.name = "StartTimeoutError";
  }
}

export async function runOn(
  driver: Driver,
  conn: DriverConnection,
  openings: Openings,
  deadline: Deadline,
  timeoutMs: number,
  target: FenceTarget,
  work: Parameters<RunInWorkTransaction>[1],
): Promise<WorkOutcome> {
  const end: RunEnd = { state: "rollback" };
  try {
    const statements: Statement[] = [];
    if (target.lockKey !== undefined) statements.push({ text: LOCK_SQL, params: [target.lockKey] });
    statements.push({
      text: conn.provesByStatus ? FENCE_SQL : FENCE_XID_SQL,
      params: [target.jobId, target.consumer],
    });
    const fence: { detail?: unknown; xid?: unknown } | undefined = (
      await openWork(conn, openings, deadline, timeoutMs, statements, end)
    ).at(-1)?.[0];
    // A pending letter: nothing runs, the fence (if written) is rolled back.
    if (typeof fence?.detail === "string") return letterOutcome(fence.detail);
    if (fence === undefined) return { status: "duplicate" };
    // The fence took the whole budget: the handler does not start (rolled back, no attempt spent).
    if (deadline.spent) throw new WorkNotStartedError(new StartTimeoutError(timeoutMs));

    // The handler's queries go through a gate that closes when its run is
    // over, before the engine sends COMMIT or ROLLBACK: a query it sends
    // later (a branch still running after another threw, a run past its
    // timeout, a savepoint or a query builder it kept) is refused, never run
    // after our COMMIT/ROLLBACK outside the transaction.
    const gate = new Gate();
    await runHandler(driver, conn, gate, deadline, timeoutMs, work, end);
    await commitWork(conn, deadline, timeoutMs, fence.xid, end);
    return { status: "committed" };
  } finally {
    await finish(conn, end.state);
  }
}

/**
 * Opens the work transaction on `conn` — BEGIN at the harness's isolation
 * level with its bounds (the first run of a pool reads the session's own),
 * then `statements` (the ordering lock, the fence), pipelined where the
 * driver can — and returns their answers, in their order.
 * Bounded like the handler: a lock held elsewhere (the ordering key, the
 * fence key of a copy still running) or a wedged connection must not hold
 * the delivery forever. Past the bound the connection's state is unknown (a
 * statement may still be waiting on the server), so it is destroyed. Any
 * failure is WorkNotStartedError: the delivery is deferred, no attempt spent.
 */
export async function openWork(
  conn: DriverConnection,
  openings: Openings,
  deadline: Deadline,
  timeoutMs: number,
  statements: readonly Statement[],
  end: RunEnd,
): Promise<Answer[]> {
  try {
    const opening = openings.for(timeoutMs);
    const all =
      opening === undefined ? [{ text: BOUNDS_SQL, params: [serverTimeoutMs(timeoutMs)] }, ...statements] : statements;
    const settled = await deadline.within(conn.start(opening ?? BARE_OPENING, all), () => {
      conn.destroy();
      return new StartTimeoutError(timeoutMs);
    });
    for (const s of settled) if (s.status === "rejected") throw s.reason;
    if (opening === undefined) openings.learn((settled[1] as PromiseFulfilledResult<Answer> | undefined)?.value);
    // One answer per statement, after the opening's own (and the bounds' read).
    return settled.slice(settled.length - statements.length).map((s) => {
      if (s.status !== "fulfilled") throw new Error("a statement of the opening did not answer");
      return s.value;
    });
  } catch (error) {
    if (error instanceof StartTimeoutError) end.state = "destroy"; // already destroyed: nothing to roll back
    throw new WorkNotStartedError(error);
  }
}

/**
 * Runs one handler on the connection behind `gate` within the run's budget;
 * the gate is closed when it returns or throws. Past the budget the handler
 * may still be running and sending on this connection: it is destroyed at
 * once, so nothing it sends later can run anywhere.
 */
export async function runHandler(
  driver: Driver,
  conn: DriverConnection,
  gate: Gate,
  deadline: Deadline,
  timeoutMs: number,
  work: Parameters<RunInWorkTransaction>[1],
  end: RunEnd,
): Promise<void> {
  const tx = handlerTransaction(driver, conn, gate);
  try {
    await bounded(
      deadline,
      timeoutMs,
      (signal) => work(tx, signal),
      () => {
        gate.close();
        end.state = "destroy";
        conn.destroy();
      },
    );
  } finally {
    gate.close();
  }
}

/**
 * The handler's Drizzle transaction: the driver's own session class over the
 * gated client, so `tx.query.*`, `tx.execute` and every builder work as on
 * the driver, and a nested `tx.transaction()` is a savepoint sent through the
 * same gate.
 */
export function handlerTransaction(driver: Driver, conn: DriverConnection, gate: Gate): WorkTransaction {
  const { dialect, schema, options } = driver.drizzle;
  const session = new driver.Session(conn.handlerClient(gate), dialect, schema, options);
  return new SavepointTransaction({ dialect, session, schema }, 0) as unknown as WorkTransaction;
}

/** Whether `tx` is a handler's work transaction (or a savepoint of one) made by this engine. */
export function isWorkTransaction(tx: unknown): boolean {
  return tx instanceof SavepointTransaction;
}

/** The parts a transaction is made of (Drizzle keeps them out of its public types). */
interface TransactionParts {
  readonly dialect: unknown;
  readonly session: unknown;
  readonly schema: unknown;
}

// biome-ignore lint/suspicious/noExplicitAny: PgTransaction is generic over the module's schema types.
class SavepointTransaction extends PgTransaction<any, any, any> {
  readonly #parts: TransactionParts;
  constructor(parts: TransactionParts, nestedIndex: number) {
    super(parts.dialect as never, parts.session as never, parts.schema as never, nestedIndex);
    this.#parts = parts;
  }

  override async transaction<T>(transaction: (tx: SavepointTransaction) => Promise<T>): Promise<T> {
    const name = `sp${this.nestedIndex + 1}`;
    const tx = new SavepointTransaction(this.#parts, this.nestedIndex + 1);
    await tx.execute(sql.raw(`savepoint ${name}`));
    try {
      const result = await transaction(tx);
      await tx.execute(sql.raw(`release savepoint ${name}`));
      return result;
    } catch (error) {
      await tx.execute(sql.raw(`rollback to savepoint ${name}`));
      throw error;
    }
  }
}

export { DecisionTimeoutError, decideDeadLetter } from "./dead-letter-decision.ts";
