/**
 * node-postgres (`pg`). A client of the pool per work transaction; BEGIN, the
 * settings, the ordering lock and the fence go out one after another (pg
 * queues a client's queries and sends each after the previous answer). pg
 * does not expose a session's transaction status, so the commit is proven by
 * the transaction id; pg never reconnects a client, so a closed socket fails
 * every later query.
 */
import { InvalidConfigError } from "../../errors.ts";
import {
  type Answer,
  type Driver,
  type DriverConnection,
  type DrizzleInternals,
  type Gate,
  queryText,
  type Statement,
  sendInOrder,
  sessionKind,
} from "../driver.ts";

interface PgResult {
  rows: Record<string, unknown>[];
  command?: string;
}
interface PgQuerier {
  query(config: unknown, params?: unknown[]): Promise<PgResult>;
}
interface PoolClient extends PgQuerier {
  /** With an error: the pool removes the client and ends it. */
  release(destroy?: Error | boolean): void;
  on(event: "error", listener: (error: Error) => void): unknown;
  off(event: "error", listener: (error: Error) => void): unknown;
  connection?: { stream?: { destroy(): void } };
}
interface PgPool extends PgQuerier {
  connect(): Promise<PoolClient>;
  on?(event: "acquire", listener: (client: PoolClient) => void): unknown;
}

const guardedPools = new WeakSet<object>();
const guardedClients = new WeakSet<object>();
const ignore = () => {};

/**
 * Every client the pool hands out keeps an 'error' listener. The engine
 * listens on its own connections, but Drizzle's `db.transaction()` — the
 * dead-letter decision, the outbox relay — checks a client out with none,
 * and pg emits the error of a backend that went away on the client itself:
 * unheard, it ends the process. Heard, the query in flight fails as usual,
 * and pg-pool removes the broken client when it is released.
 */
function guardCheckouts(pool: PgPool): void {
  if (guardedPools.has(pool) || typeof pool.on !== "function") return;
  guardedPools.add(pool);
  pool.on("acquire", (client) => {
    if (guardedClients.has(client)) return;
    guardedClients.add(client);
    client.on("error", ignore);
  });
}

export function nodePostgresDriver(db: unknown): Driver | undefined {
  const internals = db as DrizzleInternals;
  if (sessionKind(internals) !== "NodePgSession") return undefined;
  const pool = internals.$client as PgPool | undefined;
  // A single pg.Client is one session shared by every caller: two work
  // transactions on it would run inside each other.
  if (typeof pool?.connect !== "function" || typeof (pool as { totalCount?: unknown }).totalCount !== "number") {
    throw new InvalidConfigError(
      "the harness needs a pg.Pool (drizzle({ client: new pg.Pool(…) })): a single pg.Client is one session, and concurrent jobs would share its transaction",
    );
  }
  guardCheckouts(pool);
  return {
    name: "node-postgres",
    Session: internals.session.constructor as Driver["Session"],
    drizzle: { dialect: internals.dialect, schema: internals.session.schema, options: internals.session.options ?? {} },
    acquire: () => pool.connect().then(connection),
  };
}

function connection(client: PoolClient): DriverConnection {
  // pg throws at a second release: the engine may destroy a connection from
  // a timer and again when the run ends.
  let released = false;
  // A checked-out client emits the error of a backend that went away (an
  // administrator's terminate, a failover) on itself, not on the pool: with
  // no listener it ends the process. The query in flight fails with it too,
  // and that is what the engine reads; a client that errored is destroyed.
  let broken = false;
  const onError = () => {
    broken = true;
  };
  client.on("error", onError);
  const run = ({ text, params }: Statement): Promise<Answer> =>
    client.query(text, params ? [...params] : undefined).then(answer);
  return {
    provesByStatus: false,
    batches: true,
    // pg's Client sends a query only once the one before it has answered.
    pipelines: false,
    start: (opening, statements) => sendInOrder([{ text: opening.begin }, ...statements], run),
    query: run,
    transactionStatus: () => null,
    commit: () => client.query("commit").then((r) => r.command),
    rollback: () => client.query("rollback").then((r) => r.command),
    release: () => {
      if (released) return;
      released = true;
      client.off("error", onError);
      client.release(broken ? new Error("its backend went away") : undefined);
    },
    destroy: () => {
      if (released) return;
      released = true;
      // The listener stays: the socket's end still emits on this client.
      // The socket first: release(error) alone ends the client politely,
      // after whatever is in flight on it.
      client.connection?.stream?.destroy();
      client.release(new Error("destroyed by the work-transaction engine: its state is unknown"));
    },
    handlerClient: (gate) => new GatedClient(client, gate),
  };
}

/** A simple query of several statements (BEGIN with its settings) answers once per statement: the last one counts. */
function answer(result: PgResult | PgResult[]): Answer {
  const last = Array.isArray(result) ? result[result.length - 1] : result;
  return Object.assign(last?.rows ?? [], { command: last?.command });
}

/** What the handler's session talks to: the client, behind the gate. Its name must not say "Pool" (Drizzle reads it). */
class GatedClient {
  constructor(
    private readonly client: PgQuerier,
    private readonly gate: Gate,
  ) {}

  query(config: unknown, params?: unknown[]): Promise<PgResult> {
    this.gate.check(queryText(config));
    return this.client.query(config, params);
  }
}
