/**
 * postgres.js (production). A reserved connection of the pool per work
 * transaction: BEGIN, the settings, the ordering lock and the fence go out in
 * one pipelined round trip, as server-prepared statements, and the handler's
 * queries are prepared too, as postgres.js does by default (Drizzle prepares
 * only named queries). See docs/adr/0002-work-transaction-on-postgres-js.md.
 *
 * Patched (patches/postgres@3.4.9.patch) so that a reservation whose socket
 * closed refuses every later query instead of running it on a reconnected
 * session, and reports the transaction status of its last ReadyForQuery: the
 * commit is proven by that status. Unpatched, a reservation cannot tell a
 * reconnected session from its own (porsager/postgres #1208), so the work
 * transaction runs inside postgres.js's own `begin()` instead, and the commit
 * is proven by the transaction id.
 */
import { PostgresJsSession } from "drizzle-orm/postgres-js/session";
import {
  type Answer,
  type Driver,
  type DriverConnection,
  type DrizzleInternals,
  type Gate,
  type Opening,
  type Statement,
  sendInOrder,
  sessionKind,
  type TransactionStatus,
} from "../driver.ts";
import { heldConnection } from "./held.ts";

type Rows = Record<string, unknown>[] & { command?: string };
interface Querier {
  unsafe(query: string, params?: unknown[], options?: { prepare?: boolean }): Promise<Rows>;
}
interface ReservedClient extends Querier {
  release(): void;
  /** From the patch: destroys the connection (its socket), failing every query in flight. */
  terminate?: () => void;
  /** From the patch: the transaction status of the last ReadyForQuery ('I', 'T' or 'E'), null once the socket closed. */
  transactionStatus?: () => string | null;
}
interface PgClient extends Querier {
  reserve(): Promise<ReservedClient>;
  begin(fn: (sql: Querier) => Promise<unknown>): Promise<unknown>;
  options?: { prepare?: boolean };
}

export function postgresJsDriver(db: unknown, options: { readonly pipeline: boolean }): Driver | undefined {
  const internals = db as DrizzleInternals;
  if (sessionKind(internals) !== "PostgresJsSession") return undefined;
  const client = internals.$client as PgClient | undefined;
  if (typeof client?.reserve !== "function" || typeof client.begin !== "function") return undefined;
  // A client made with `prepare: false` (e.g. behind a transaction-mode
  // pooler) must not get named statements from us either.
  const prepare = client.options?.prepare !== false;
  const drizzle = {
    dialect: internals.dialect,
    schema: internals.session.schema,
    options: internals.session.options ?? {},
  };
  const Session = (prepare ? PreparedPostgresJsSession : PostgresJsSession) as unknown as Driver["Session"];
  const run = (conn: Querier, { text, params }: Statement): Promise<Answer> =>
    conn.unsafe(text, params ? (params as unknown[]) : [], params ? { prepare } : undefined);

  const patched: Driver = {
    name: "postgres.js",
    Session,
    drizzle,
    async acquire() {
      const conn = await client.reserve();
      if (typeof conn.transactionStatus !== "function" || typeof conn.terminate !== "function") {
        conn.release();
        warnUnpatched();
        return unpatched.acquire();
      }
      return reserved(conn);
    },
  };
  const unpatched: Driver = {
    name: "postgres.js",
    Session,
    drizzle,
    acquire: () =>
      heldConnection<Querier>((inside) => client.begin(inside), {
        query: run,
        exec: (sql, text) => sql.unsafe(text),
        handlerClient: (sql, gate) => new GatedClient(sql, gate),
        // begin() resolves once COMMIT answered; the engine proved before it
        // that the transaction was open and not failed.
        committed: (outcome) => (outcome.status === "fulfilled" ? "COMMIT" : undefined),
        // begin() rejects at the end with any statement's error, even one a
        // savepoint undid: one failing job would fail its whole batch.
        batches: false,
      }),
  };

  const reserved = (conn: ReservedClient) => new ReservedConnection(conn, prepare, options.pipeline);
  return patched;
}

/** One reserved connection (a class: no functions made per job). */
class ReservedConnection implements DriverConnection {
  /** The patched reservation reports its last ReadyForQuery's status, null once its socket closed. */
  readonly provesByStatus = true;
  readonly batches = true;
  constructor(
    private readonly conn: ReservedClient,
    private readonly prepare: boolean,
    private readonly pipeline: boolean,
  ) {}
  get pipelines(): boolean {
    return this.pipeline;
  }

  start(opening: Opening, statements: readonly Statement[]): Promise<PromiseSettledResult<Answer>[]> {
    const all: Statement[] = [{ text: opening.begin }, ...statements];
    return this.pipeline ? Promise.allSettled(all.map((s) => this.query(s))) : sendInOrder(all, (s) => this.query(s));
  }
  query({ text, params }: Statement): Promise<Answer> {
    return this.conn.unsafe(text, params ? (params as unknown[]) : [], params ? { prepare: this.prepare } : undefined);
  }
  transactionStatus(): TransactionStatus | null {
    return (this.conn.transactionStatus?.() ?? null) as TransactionStatus | null;
  }
  async commit(before?: string): Promise<string | undefined> {
    const answer: unknown = await this.conn.unsafe(before === undefined ? "commit" : `${before}; commit`);
    // Several statements with rows among them answer as a list of results,
    // COMMIT's tag on the last one.
    const results = answer as Rows[];
    const last = results[results.length - 1];
    return (Array.isArray(last) ? last : (answer as Rows)).command;
  }
  async rollback(): Promise<string | undefined> {
    return (await this.conn.unsafe("rollback")).command;
  }
  release(): void {
    this.conn.release();
  }
  destroy(): void {
    this.conn.terminate?.();
  }
  handlerClient(gate: Gate): unknown {
    return new GatedClient(this.conn, gate);
  }
}

let warnedUnpatched = false;
function warnUnpatched(): void {
  if (warnedUnpatched) return;
  warnedUnpatched = true;
  process.emitWarning(
    "@softcrum/core: postgres.js is not patched against porsager/postgres #1208, so work transactions run inside its begin(), unpipelined, each commit proven by transaction id (safe, slower); for the pipelined path apply the patch @softcrum/core ships, patches/postgres@3.4.9.patch (ADR 0012)",
  );
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

/** What the handler's session talks to: the connection, behind the gate. A class: no functions made per job. */
class GatedClient {
  constructor(
    private readonly conn: Querier,
    private readonly gate: Gate,
  ) {}

  // Returns postgres.js's own pending query: Drizzle calls .values() on it
  // before it runs. Drizzle calls this inside async functions, so the
  // refusal reaches the handler as a rejected query.
  unsafe(query: string, params?: unknown[], options?: { prepare?: boolean }): Promise<Rows> {
    this.gate.check(query);
    return this.conn.unsafe(query, params, options);
  }
}
