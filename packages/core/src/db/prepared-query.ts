/**
 * A handler's hot query, built once per consumer's database and bound to each
 * job's work transaction (#23 item 2).
 *
 * Drizzle's `.prepare()` binds a query to the session it was built on. A
 * handler's `tx` is made per job (it is the job's work transaction, behind
 * the gate that closes before COMMIT), so a query prepared on one job's `tx`
 * cannot serve the next, and one prepared on `db` would run on another
 * connection, outside the work transaction, beside the fence: not
 * exactly-once. `preparedQuery` builds the query once (Drizzle's query
 * builder costs a handler more client CPU than the rest of the harness's
 * per-job work) and gives each job a copy bound to that job's `tx`: its
 * statements go through the job's gate, in the job's transaction, and are
 * undone with it.
 *
 * The copy is Drizzle's own prepared query with its client swapped (every
 * driver's prepared query keeps the session's client as `client`). A query
 * that is not provably on the job's `tx` — built on `db` or another session
 * by a `build` that ignored its argument, or by a Drizzle version that keeps
 * its client elsewhere — is an InvalidConfigError before it can run: its
 * statements would go outside the job's transaction.
 */
import { InvalidConfigError } from "../errors.ts";
import type { WorkTransaction } from "./types.ts";
import { isWorkTransaction } from "./work-transaction.ts";

/** What `build` returns: any Drizzle query builder with `.prepare()` (select, insert, update, delete, relational). */
export interface Preparable {
  prepare(name: string): object;
}

/** The job's copy of the query, as `build(tx).prepare(name)` returns it. */
export type BindPrepared<TQuery extends Preparable> = (tx: WorkTransaction) => ReturnType<TQuery["prepare"]>;

interface SessionParts {
  readonly client: unknown;
  readonly dialect: object;
}

/** The first job's prepared query, per Drizzle database (its dialect), without its client. */
type Template = object;

const NAME = /^[a-z_][a-z0-9_]{0,62}$/i;

/**
 * Declares a handler's hot query, built once: `build` gets a work
 * transaction and returns a Drizzle query builder whose varying values are
 * `sql.placeholder(...)`; the result binds it to a job's `tx`:
 *
 *     const credit = preparedQuery("loyalty_credit", (tx) =>
 *       tx.insert(ledger).values({ jobId: sql.placeholder("jobId"), amount: sql.placeholder("amount") }));
 *     // in the handler:
 *     await credit(tx).execute({ jobId: envelope.job_id, amount: data.amount });
 *
 * `name` is the name Drizzle's `.prepare(name)` is given, a Postgres
 * identifier; no driver sends it as a named statement (see `unnamed`). Only a
 * handler's `tx` (or a savepoint of it) is accepted: a query bound to `db`
 * would not be part of the work transaction.
 */
export function preparedQuery<TQuery extends Preparable>(
  name: string,
  build: (tx: WorkTransaction) => TQuery,
): BindPrepared<TQuery> {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new InvalidConfigError(
      `preparedQuery: the name must be a Postgres identifier of letters, digits and underscores (at most 63, not starting with a digit), got ${JSON.stringify(name)}`,
    );
  }
  if (typeof build !== "function") {
    throw new InvalidConfigError(`preparedQuery "${name}": build must be a function of the handler's tx`);
  }
  const templates = new WeakMap<object, Template>();
  return (tx) => {
    if (!isWorkTransaction(tx)) {
      throw new InvalidConfigError(
        `preparedQuery "${name}": bind it to the handler's tx (ctx.tx, or a savepoint of it), not to a database or another transaction: anywhere else its statements would run outside the work transaction that holds the job's fence`,
      );
    }
    const session = (tx as unknown as { session: SessionParts }).session;
    const template = templates.get(session.dialect);
    if (template === undefined) {
      const prepared = buildOn(tx, name, build);
      templates.set(session.dialect, templateOf(prepared, session, name));
      return prepared as ReturnType<TQuery["prepare"]>;
    }
    return Object.assign(Object.create(Object.getPrototypeOf(template)), template, { client: session.client });
  };
}

function buildOn(tx: WorkTransaction, name: string, build: (tx: WorkTransaction) => Preparable): object {
  const query = build(tx);
  if (typeof query?.prepare !== "function") {
    throw new InvalidConfigError(
      `preparedQuery "${name}": build must return a Drizzle query builder (something with .prepare()), got ${query === null ? "null" : typeof query}`,
    );
  }
  return unnamed(query.prepare(name));
}

/**
 * node-postgres sends a prepared query under its name, as a named statement
 * of the server connection, which a transaction-mode pooler does not keep
 * (the next transaction may get another connection): the copies go unnamed,
 * as the harness's own statements and the handler's other queries do on
 * node-postgres. postgres.js prepares by text exactly when the client
 * prepares its other queries (never with `prepare: false`), whatever the name.
 */
function unnamed(prepared: object): object {
  const named = prepared as { rawQueryConfig?: unknown; queryConfig?: unknown };
  for (const key of ["rawQueryConfig", "queryConfig"] as const) {
    const config = named[key];
    if (typeof config === "object" && config !== null && "name" in config) named[key] = { ...config, name: undefined };
  }
  return prepared;
}

/**
 * The template of later jobs' copies. `prepared` must run on the job's `tx`
 * and nothing else: it keeps the session's client as `client` (so swapping
 * it moves the query to another job's transaction) and no other own
 * property refers to the session or its client. The template keeps no
 * job's client of its own (a relational query's result mapper still refers
 * to the first job's builder, whose gate is closed: nothing can be sent
 * through it).
 */
function templateOf(prepared: object, session: SessionParts, name: string): Template {
  const own = prepared as Record<string, unknown>;
  const elsewhere = Object.keys(own).filter(
    (key) => key !== "client" && (own[key] === session || own[key] === session.client),
  );
  if (session.client === undefined || own["client"] !== session.client || elsewhere.length > 0) {
    throw new InvalidConfigError(
      `preparedQuery "${name}": the query build returned does not run on the tx it was given (build it with that tx, never with db or another transaction): its statements would run outside the job's work transaction`,
    );
  }
  return Object.assign(Object.create(Object.getPrototypeOf(prepared)), prepared, { client: undefined });
}
