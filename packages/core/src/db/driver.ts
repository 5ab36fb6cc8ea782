/**
 * The driver port of the work-transaction engine (`work-transaction.ts`).
 *
 * A driver supplies I/O only: a connection of its own for one work
 * transaction, statements sent on it, its answers as the wire gave them, and
 * the driver's Drizzle session class. Every rule of SPEC §4 — the bounds, the
 * isolation level, the ordering lock, the fence, what a commit proves, when a
 * connection is destroyed instead of released — lives in the engine, once.
 * One file per driver in `drivers/`, each of the same shape: a
 * `<name>Driver(db)` that returns a Driver for a Drizzle database of that
 * driver, or undefined for any other.
 */
import { SessionSettingError, TransactionControlError, WorkTransactionOverError } from "./errors.ts";
import { sessionSettingIn, transactionControlIn } from "./transaction-control.ts";

/** A statement: text, and its parameters (none: sent as a simple query, which may hold several statements). */
export interface Statement {
  readonly text: string;
  readonly params?: readonly unknown[];
}

/**
 * What the server answered to one statement: its rows, and the command tag
 * (`COMMIT`, `ROLLBACK`, `INSERT`…) when the driver reports it. postgres.js
 * answers in this shape already, so its hot path makes no object per statement.
 */
export type Answer = readonly Record<string, unknown>[] & { readonly command?: string | undefined };

/** How the engine opens a transaction: the same isolation level, whichever way the driver begins. */
export interface Opening {
  /** BEGIN with its options, a simple query: for a driver that sends BEGIN itself. */
  readonly begin: string;
  /** The same options for a transaction the driver has already begun (PGlite, postgres.js's `begin()`). */
  readonly inTransaction: string;
}

/** The transaction status of a session, from its last ReadyForQuery: idle, in a transaction, in a failed one. */
export type TransactionStatus = "I" | "T" | "E";

/** One connection, held by one work transaction from `acquire()` until `release()` or `destroy()`. */
export interface DriverConnection {
  /**
   * Whether this connection's commit is proven by the session's transaction
   * status (`transactionStatus()`); otherwise the engine compares the
   * transaction id the fence was written in with the one open right before
   * COMMIT. A property of the connection, not of the driver: a postgres.js
   * pool is only known to carry the #1208 patch once a reservation shows it.
   */
  readonly provesByStatus: boolean;
  /**
   * Whether a failed statement undone with ROLLBACK TO SAVEPOINT leaves the
   * rest of the transaction free to commit, so a batch can undo one job
   * alone (`batch.ts`). Not on postgres.js's own `begin()`, which fails the
   * whole transaction after any failed statement: a batch runs there one job
   * per transaction.
   */
  readonly batches: boolean;
  /**
   * Whether statements sent without waiting for earlier answers share round
   * trips (postgres.js pipelines them). Only then do the handlers of a
   * `concurrent` batch run at once (`batch.ts`); elsewhere they
   * would only queue, so they run one after another.
   */
  readonly pipelines: boolean;
  /**
   * Opens the transaction (`opening`), then runs `statements` in it, in this
   * order, all sent at once where the driver can pipeline. Settles the
   * opening and then each statement (so the result has one more entry than
   * `statements`); a statement after a failed one is never run outside the
   * transaction.
   */
  start(opening: Opening, statements: readonly Statement[]): Promise<PromiseSettledResult<Answer>[]>;
  /** One statement in the open transaction (the engine's own checks). */
  query(statement: Statement): Promise<Answer>;
  /**
   * The session's transaction status from the wire, null once the
   * connection closed. Only read where `provesByStatus` is true.
   */
  transactionStatus(): TransactionStatus | null;
  /**
   * Sends COMMIT; resolves with the command tag the server answered
   * (`ROLLBACK` for a failed transaction). `before` (statements without
   * parameters) goes in COMMIT's own simple-protocol message, ahead of it;
   * the engine passes it only where `provesByStatus`.
   */
  commit(before?: string): Promise<string | undefined>;
  /** Sends ROLLBACK; resolves with the command tag the server answered. */
  rollback(): Promise<string | undefined>;
  /** Back to the pool: only ever called when the connection is known to have no transaction open. */
  release(): void;
  /** Closes the connection itself (its socket): whatever was in flight on it fails, nothing sent later runs. */
  destroy(): void;
  /**
   * The client the handler's Drizzle session talks to: the driver's own
   * client shape (postgres.js `unsafe`, node-postgres and PGlite `query`),
   * every call of which asks `gate` first. Savepoints, prepared queries and
   * query builders made from the handler's `tx` all end up here, so once the
   * gate is closed nothing derived from `tx` can run.
   */
  handlerClient(gate: Gate): unknown;
}

export interface Driver {
  readonly name: "postgres.js" | "node-postgres" | "PGlite";
  /** A connection of this work transaction's own. */
  acquire(): Promise<DriverConnection>;
  /** The driver's Drizzle session class: `new Session(handlerClient, dialect, schema, options)`. */
  readonly Session: new (
    client: unknown,
    dialect: unknown,
    schema: unknown,
    options: unknown,
  ) => unknown;
  /** The database's Drizzle internals the handler's transaction is built from. */
  readonly drizzle: { readonly dialect: unknown; readonly schema: unknown; readonly options: unknown };
}

/** Closed by the engine when a run is over; every query of the handler asks it first, with the query's text. */
export class Gate {
  #over = false;
  get over(): boolean {
    return this.#over;
  }
  close(): void {
    this.#over = true;
  }
  /**
   * Throws WorkTransactionOverError once closed, TransactionControlError
   * for a text that would end the transaction (with the fence written before
   * the handler runs, a handler's `rollback; begin` would leave its work to
   * commit in a transaction of its own, without the fence, and a transaction
   * status of 'T' would still read as the work transaction's), and
   * SessionSettingError for one whose setting would outlive it on the
   * pooled connection.
   */
  check(text?: unknown): void {
    if (this.#over) throw new WorkTransactionOverError();
    if (typeof text !== "string") return;
    const control = transactionControlIn(text);
    if (control !== undefined) throw new TransactionControlError(control);
    const setting = sessionSettingIn(text);
    if (setting !== undefined) throw new SessionSettingError(setting);
  }
}

/** The text of a query as a driver's client is given it: a string, or a config object with `text`. */
export function queryText(query: unknown): unknown {
  return typeof query === "string" ? query : (query as { text?: unknown } | null | undefined)?.text;
}

/** Drizzle's internals of a database: present on every PgDatabase at run time, not in its public types. */
export interface DrizzleInternals {
  readonly dialect: unknown;
  readonly session: {
    readonly constructor: abstract new (...args: never[]) => unknown;
    readonly client?: unknown;
    readonly options?: object;
    readonly schema?: unknown;
  };
  readonly $client?: unknown;
}

/** The entityKind name of the database's Drizzle session class (`PostgresJsSession`, `NodePgSession`, `PgliteSession`). */
export function sessionKind(internals: DrizzleInternals): string | undefined {
  const kind = (internals.session?.constructor as unknown as { [key: symbol]: unknown } | undefined)?.[ENTITY_KIND];
  return typeof kind === "string" ? kind : undefined;
}
const ENTITY_KIND = Symbol.for("drizzle:entityKind");

/** Settles every statement, one after another; after a failure the rest are not sent. */
export async function sendInOrder(
  statements: readonly Statement[],
  run: (statement: Statement) => Promise<Answer>,
): Promise<PromiseSettledResult<Answer>[]> {
  const settled: PromiseSettledResult<Answer>[] = [];
  for (const statement of statements) {
    if (settled.some((s) => s.status === "rejected")) {
      settled.push({ status: "rejected", reason: new Error("not sent: an earlier statement failed") });
      continue;
    }
    try {
      settled.push({ status: "fulfilled", value: await run(statement) });
    } catch (reason) {
      settled.push({ status: "rejected", reason });
    }
  }
  return settled;
}
