/**
 * Opens the work transaction, writes the fence in it, and runs the handler's
 * work in the same transaction only when the fence is new.
 *
 * Two ways to do that, same semantics:
 * - any Drizzle Postgres driver: `db.transaction()` and the fence through the
 *   query builder;
 * - postgres.js (production): the harness opens the transaction itself on a
 *   reserved connection, so that BEGIN, the ordering lock and the fence insert
 *   go out in one pipelined round trip, as server-prepared statements; the
 *   handler gets a Drizzle transaction on that connection whose queries are
 *   prepared too, as postgres.js does by default (Drizzle prepares only named
 *   queries). See docs/adr/0002-work-transaction-on-postgres-js.md for why and
 *   what it relies on.
 */
import { is, sql } from "drizzle-orm";
import type { PgDialect } from "drizzle-orm/pg-core";
import { PostgresJsSession, PostgresJsTransaction } from "drizzle-orm/postgres-js/session";
import type { AnyPgDatabase, WorkTransaction } from "../consumer.ts";
import { processedJobs } from "./schema.ts";

export interface FenceTarget {
  readonly jobId: string;
  readonly consumer: string;
  /** Serialise on this key (transaction-scoped advisory lock) before the fence. */
  readonly lockKey?: string | undefined;
}

/** Resolves true when the fence was new and `work` ran and committed; false for a duplicate (nothing ran). */
export type RunInWorkTransaction = (
  target: FenceTarget,
  work: (tx: WorkTransaction) => Promise<void>,
) => Promise<boolean>;

export function workTransactionFor(db: AnyPgDatabase): RunInWorkTransaction {
  return pipelinedPostgresJs(db) ?? viaDrizzleTransaction(db);
}

const LOCK_SQL = "select pg_advisory_xact_lock(hashtextextended($1, 0))";
const FENCE_SQL =
  "insert into core.processed_jobs (job_id, consumer) values ($1, $2) on conflict do nothing returning 1";

function viaDrizzleTransaction(db: AnyPgDatabase): RunInWorkTransaction {
  return (target, work) =>
    db.transaction(async (tx) => {
      if (target.lockKey !== undefined) {
        await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${target.lockKey}, 0))`);
      }
      // ON CONFLICT DO NOTHING waits on a concurrent insert of the same key
      // and then sees the conflict: two parallel deliveries give one effect.
      const fence = await tx
        .insert(processedJobs)
        .values({ jobId: target.jobId, consumer: target.consumer })
        .onConflictDoNothing()
        .returning({ jobId: processedJobs.jobId });
      if (fence.length === 0) return false;
      await work(tx);
      // Some drivers COMMIT an aborted transaction as a silent ROLLBACK: if the
      // handler caught the error of a failed statement, this raises instead
      // (25P02), so the job is retried rather than acknowledged with nothing done.
      await tx.execute(sql`select 1`);
      return true;
    });
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
}

/** Drizzle's internals this path needs: present on every PgDatabase at run time, not in its public types. */
interface DrizzleInternals {
  readonly dialect: PgDialect;
  readonly session: unknown;
  readonly $client?: unknown;
}

/** postgres.js errors that mean the connection is gone: nothing more can be sent on it. */
const CONNECTION_GONE = new Set([
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED",
  "CONNECTION_ENDED",
  "ECONNRESET",
  "EPIPE",
]);

function pipelinedPostgresJs(db: AnyPgDatabase): RunInWorkTransaction | undefined {
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
  const Session = (prepare ? PreparedPostgresJsSession : PostgresJsSession) as unknown as new (
    ...args: AnyArgs
  ) => PostgresJsSession<never, never, never>;

  return async (target, work) => {
    const conn = await client.reserve();
    let open = false;
    try {
      // Sent together without waiting: postgres.js pipelines them on the connection.
      const begin = conn.unsafe("begin");
      const lock = target.lockKey === undefined ? undefined : conn.unsafe(LOCK_SQL, [target.lockKey], { prepare });
      const fence = conn.unsafe(FENCE_SQL, [target.jobId, target.consumer], { prepare });
      // Settle all three before deciding, so no rejection is left unhandled.
      const [began, locked, fenced] = await Promise.allSettled([begin, lock, fence]);
      if (began.status === "fulfilled") open = true;
      for (const settled of [began, locked, fenced]) if (settled.status === "rejected") throw settled.reason;
      const inserted = fenced.status === "fulfilled" && fenced.value.length > 0;
      if (inserted) {
        const txSession = new Session(sessionClient(conn), dialect, schema, sessionOptions);
        await work(new PostgresJsTransaction(dialect, txSession, schema as never) as unknown as WorkTransaction);
      }
      const committed = await conn.unsafe("commit");
      open = false;
      // Postgres answers COMMIT of an aborted transaction with ROLLBACK, no
      // error: a statement failed and the handler caught its error. Nothing
      // was written, so the job must not be acknowledged as done.
      if (committed.command !== "COMMIT") {
        throw new Error(
          "the work transaction was rolled back: a statement failed inside it and the handler caught its error",
        );
      }
      return inserted;
    } catch (error) {
      const code = (error as { code?: unknown })?.code;
      if (open && !(typeof code === "string" && CONNECTION_GONE.has(code))) {
        await conn.unsafe("rollback").catch(() => {});
      }
      throw error;
    } finally {
      conn.release();
    }
  };
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
