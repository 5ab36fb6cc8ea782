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
 * - a job that has a `pending_review` dead letter is never committed: the
 *   dead-letter decision holds the fence key while it writes the letter
 *   (`decideDeadLetter`), and a deferred constraint trigger on the fence
 *   (migration 0005) refuses the COMMIT of a job whose letter is pending.
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
  /** `signal()` gives the run's AbortSignal (made on first call). */
  work: (tx: WorkTransaction, signal: () => AbortSignal) => Promise<void>,
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
 * The fence; a new one also sets the server-side time bound for the rest of
 * the transaction (RETURNING runs only for an inserted row). One row: new.
 */
const FENCE_SQL = `insert into core.processed_jobs (job_id, consumer) values ($1, $2) on conflict do nothing
  returning set_config('statement_timeout', $3, true) as st`;

/**
 * The SQLSTATE of the deferred constraint trigger on `core.processed_jobs`
 * (migration 0005): at COMMIT, a fence whose job has a `pending_review`
 * dead letter fails the commit, with "<letter id> <error class>" as detail.
 */
const PENDING_LETTER = "SC001";

interface FenceRow {
  inserted: number;
}

/** The letter a commit was refused for, from the trigger's error; undefined for any other error. */
function pendingLetterOf(error: unknown): WorkOutcome | undefined {
  const e = error as { code?: unknown; detail?: unknown; cause?: unknown } | undefined;
  if (e?.code !== PENDING_LETTER) return e?.cause === undefined ? undefined : pendingLetterOf(e.cause);
  const [deadLetterId, errorClass] = typeof e.detail === "string" ? e.detail.split(" ") : [];
  return { status: "dead_lettered", deadLetterId: deadLetterId ?? "unknown", errorClass: errorClass ?? "unknown" };
}

/** Milliseconds as a Postgres duration setting; at least 1 ms (0 would mean "no limit"). */
function serverTimeout(timeoutMs: number): string {
  return `${Math.max(1, Math.ceil(timeoutMs))}ms`;
}

/** Runs `work` with an AbortSignal that fires after `timeoutMs`; rejects with HandlerTimeoutError then. */
async function bounded(
  timeoutMs: number,
  work: (signal: () => AbortSignal) => Promise<void>,
  onTimeout: () => void,
): Promise<void> {
  // Made on first use: most handlers never read their signal, and this runs per job.
  let controller: AbortController | undefined;
  const controlled = () => {
    controller ??= new AbortController();
    return controller;
  };
  const signal = () => controlled().signal;
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const error = new HandlerTimeoutError(timeoutMs);
      controlled().abort(error);
      onTimeout();
      reject(error);
    }, timeoutMs);
  });
  try {
    await Promise.race([work(signal), timedOut]);
  } finally {
    clearTimeout(timer);
  }
}

function viaDrizzleTransaction(db: AnyPgDatabase): RunInWorkTransaction {
  return async (target, work) => {
    let started = false;
    try {
      return await db.transaction(async (tx) => {
        if (target.lockKey !== undefined) {
          await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${target.lockKey}, 0))`);
        }
        // ON CONFLICT DO NOTHING waits on a concurrent insert of the same key
        // and then sees the conflict: two parallel deliveries give one effect.
        const timeout = serverTimeout(target.timeoutMs ?? DEFAULT_TIMEOUT_MS);
        const [fence] = rowsOf<FenceRow & { xid: string }>(
          await tx.execute(sql`with fence as (
  insert into core.processed_jobs (job_id, consumer) values (${target.jobId}, ${target.consumer}) on conflict do nothing returning 1
)
select (select count(*)::int from fence) as inserted, txid_current()::text as xid,
  set_config('statement_timeout', ${timeout}, true) as st`),
        );
        if (!fence || fence.inserted === 0) return { status: "duplicate" } as const;
        started = true;
        await bounded(target.timeoutMs ?? DEFAULT_TIMEOUT_MS, (signal) => work(tx, signal), noop);
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
      const letter = pendingLetterOf(error);
      if (letter) return letter;
      if (!started) throw new WorkNotStartedError(error);
      throw error;
    }
  };
}

const noop = () => {};

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

  return async (target, work) => {
    let conn: ReservedClient;
    try {
      conn = await client.reserve();
    } catch (error) {
      throw new WorkNotStartedError(error);
    }
    if (typeof conn.transactionStatus !== "function" || typeof conn.terminate !== "function") {
      // postgres.js without patches/postgres@3.4.9.patch: a reservation cannot
      // tell a reconnected session from its own, so take the slower path,
      // which checks the transaction id before COMMIT.
      conn.release();
      return generic(target, work);
    }
    let state: "idle" | "rollback" | "destroy" = "rollback";
    try {
      let inserted: boolean;
      try {
        const timeout = serverTimeout(target.timeoutMs ?? DEFAULT_TIMEOUT_MS);
        const settled = await send(conn, [
          ["begin", []],
          ...(target.lockKey === undefined ? [] : [[LOCK_SQL, [target.lockKey]] as const]),
          [FENCE_SQL, [target.jobId, target.consumer, timeout]],
        ]);
        for (const s of settled) if (s.status === "rejected") throw s.reason;
        const last = settled[settled.length - 1];
        if (last?.status !== "fulfilled") throw new Error("the fence insert did not answer");
        inserted = last.value.length > 0;
      } catch (error) {
        throw new WorkNotStartedError(error);
      }
      if (!inserted) {
        // Duplicate: nothing was written; COMMIT would do as well as ROLLBACK.
        return { status: "duplicate" };
      }

      const txSession = new Session(sessionClient(conn), dialect, schema, sessionOptions);
      const tx = new PostgresJsTransaction(dialect, txSession, schema as never) as unknown as WorkTransaction;
      await bounded(
        target.timeoutMs ?? DEFAULT_TIMEOUT_MS,
        (signal) => work(tx, signal),
        () => {
          // The handler may still be running and sending on this connection:
          // destroy it now, so nothing it sends later can run anywhere.
          state = "destroy";
          destroy(conn);
        },
      );

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
        committed = await conn.unsafe("commit", [], { prepare });
      } catch (error) {
        const letter = pendingLetterOf(error);
        if (letter) {
          // A concurrent delivery dead-lettered the job: the commit was refused, nothing is left open.
          state = "idle";
          return letter;
        }
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
  };
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
 * then has its COMMIT refused by the fence's trigger (the letter is pending).
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

function sessionClient(conn: ReservedClient): SessionClient {
  let depth = 0;
  const client: SessionClient = {
    // Passed through untouched: Drizzle calls .values() on the query before it runs.
    unsafe: conn.unsafe,
    async savepoint(fn) {
      depth += 1;
      const name = `softcrum_sp_${depth}`;
      await conn.unsafe(`savepoint ${name}`);
      try {
        const result = await fn(client);
        await conn.unsafe(`release savepoint ${name}`);
        return result;
      } catch (error) {
        await conn.unsafe(`rollback to savepoint ${name}`);
        throw error;
      } finally {
        depth -= 1;
      }
    },
  };
  return client;
}
