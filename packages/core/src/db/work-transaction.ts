/**
 * Opens the work transaction, writes the fence in it, and runs the handler's
 * work in the same transaction only when the fence is new.
 *
 * Two ways to do that, same semantics:
 * - any Drizzle Postgres driver: `db.transaction()` and the fence through the
 *   query builder;
 * - postgres.js (production): the harness opens the transaction with
 *   postgres.js' own `begin()`, sends the ordering lock and the fence insert
 *   together (pipelined) as server-prepared statements, and gives the handler
 *   a Drizzle transaction on that connection whose queries are prepared too,
 *   as postgres.js does by default (Drizzle prepares only named queries). See
 *   docs/adr/0002-work-transaction-on-postgres-js.md for why and what it relies on.
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
  return preparedPostgresJs(db) ?? viaDrizzleTransaction(db);
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
  begin<T>(fn: (sql: TransactionClient) => Promise<T>): Promise<T>;
  options?: { prepare?: boolean };
}
interface TransactionClient {
  unsafe(query: string, params?: unknown[], options?: { prepare?: boolean }): Promise<unknown[]>;
}

/** Drizzle's internals this path needs: present on every PgDatabase at run time, not in its public types. */
interface DrizzleInternals {
  readonly dialect: PgDialect;
  readonly session: unknown;
  readonly $client?: unknown;
}

function preparedPostgresJs(db: AnyPgDatabase): RunInWorkTransaction | undefined {
  const internals = db as unknown as DrizzleInternals;
  if (!is(internals.session, PostgresJsSession)) return undefined;
  const client = internals.$client as PgClient | undefined;
  if (typeof client?.begin !== "function") return undefined;
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

  // postgres.js' begin() is what keeps this safe: it rejects when the
  // connection closes mid-transaction, and it refuses to COMMIT a transaction
  // in which any statement failed, even one whose error the handler caught.
  return (target, work) =>
    client.begin(async (sql) => {
      // The lock and the fence go out together, pipelined on the connection.
      const lock = target.lockKey === undefined ? undefined : sql.unsafe(LOCK_SQL, [target.lockKey], { prepare });
      const fence = sql.unsafe(FENCE_SQL, [target.jobId, target.consumer], { prepare });
      await lock;
      if ((await fence).length === 0) return false;
      const txSession = new Session(sql, dialect, schema, sessionOptions);
      await work(new PostgresJsTransaction(dialect, txSession, schema as never) as unknown as WorkTransaction);
      return true;
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
