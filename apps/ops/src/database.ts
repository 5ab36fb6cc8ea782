/**
 * The CLI's database: opened once per command, never migrated (#10 item 12).
 * Before any command runs it checks, with catalog reads only, that it reached
 * a Softcrum database its role may use, and says in one line what is wrong
 * when not: a refused connection, a database that does not exist, a failed
 * login, a database without the Softcrum tables, a missing privilege.
 *
 * Who acts is the database role the CLI logged in as (`session_user`), never
 * a name typed on the command line: the database authenticated it (ADR 0003).
 */
import type { AnyPgDatabase } from "@softcrum/core";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";

/** A problem the operator can fix, said in one line (no SQL, no parameters, no stack). */
export class DatabaseProblem extends Error {}

export interface OpsDatabase {
  readonly db: AnyPgDatabase;
  /** The role this connection authenticated as: the operator recorded on every change. */
  readonly operator: string;
  readonly database: string;
  /**
   * Whether this login may act as `role` grants (a shipped role, migration
   * 0018_ops_roles): a member of it, or a session the database trusts to name
   * the actor (the schema's owner, the HTTP API's role).
   */
  mayActAs(role: ShippedRole): Promise<boolean>;
  close(): Promise<void>;
}

/** The roles the deploy step's migrations create (runbooks/dead-letter-replay.md, "Database roles"). */
export type ShippedRole = "softcrum_ops_operator" | "softcrum_ops_approver" | "softcrum_worker";

/** Tables every operator command reads. */
const TABLES = ["core.dead_letters", "core.replay_batches", "core.replay_batch_items", "core.ops_audit"] as const;

export async function openOpsDatabase(url: string): Promise<OpsDatabase> {
  const target = describeTarget(url);
  // A short connect timeout: an unreachable host is an error in seconds, not a hang.
  const client = postgres(url, { max: 4, connect_timeout: 10, onnotice: () => {} });
  const close = async () => {
    // Ending a pool whose connection failed can wait for ever; never let it keep the process up.
    await Promise.race([client.end({ timeout: 2 }), new Promise((resolve) => setTimeout(resolve, 3000).unref())]);
  };
  try {
    const [who] = await client<{ operator: string; database: string }[]>`
      select session_user as operator, current_database() as database`;
    const operator = who?.operator ?? "";
    const database = who?.database ?? target.database;
    const checks = await client<{ name: string; present: boolean; readable: boolean | null }[]>`
      select t.name, to_regclass(t.name) is not null as present,
             case when to_regclass(t.name) is null then null else has_table_privilege(t.name, 'select') end as readable
      from unnest(${TABLES as unknown as string[]}::text[]) as t(name)`;
    const missing = checks.filter((c) => !c.present).map((c) => c.name);
    if (missing.length > 0) {
      throw new DatabaseProblem(
        `database "${database}" on ${target.host} has no Softcrum tables (${missing.join(", ")} missing): ` +
          "is DATABASE_URL the module's database? A new database is migrated by the deploy step (pnpm db:migrate), never by this CLI",
      );
    }
    const unreadable = checks.filter((c) => c.readable === false).map((c) => c.name);
    if (unreadable.length > 0) {
      throw new DatabaseProblem(
        `the database role "${operator}" may not read ${unreadable.join(", ")}: grant it the operator privileges (runbooks/dead-letter-replay.md, "Database roles")`,
      );
    }
    const mayActAs = async (role: ShippedRole) => {
      const [row] = await client<{ may: boolean }[]>`
        select to_regrole(${role}) is not null
               and (core.ops_trusted() or pg_has_role(session_user, ${role}, 'MEMBER')) as may`;
      return row?.may === true;
    };
    return { db: drizzle({ client }) as unknown as AnyPgDatabase, operator, database, mayActAs, close };
  } catch (error) {
    void close();
    throw error instanceof DatabaseProblem ? error : new DatabaseProblem(explainDatabaseError(error, target));
  }
}

/** Host, port and database of a URL, for messages (never the password). */
export function describeTarget(url: string): { host: string; database: string; user: string } {
  try {
    const u = new URL(url);
    return {
      host: `${u.hostname || "localhost"}:${u.port || "5432"}`,
      database: decodeURIComponent(u.pathname.replace(/^\//, "")) || "(default)",
      user: decodeURIComponent(u.username) || "(default)",
    };
  } catch {
    return { host: "(unparsable DATABASE_URL)", database: "?", user: "?" };
  }
}

/**
 * One line naming the cause of a database error, from its code: never the
 * query or its parameters (a Drizzle error's message holds both).
 */
export function explainDatabaseError(
  error: unknown,
  target = { host: "the server", database: "?", user: "?" },
): string {
  const e = rootOf(error) as { code?: string; message?: string; errno?: string; routine?: string } | undefined;
  const code = e?.code ?? "";
  const message = (e?.message ?? String(error)).split("\n")[0] as string;
  switch (code) {
    case "ECONNREFUSED":
      return `cannot connect to Postgres at ${target.host}: connection refused (is it running? are DATABASE_URL's host and port right?)`;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `cannot connect to Postgres: host of ${target.host} not found (check DATABASE_URL)`;
    case "ETIMEDOUT":
    case "CONNECT_TIMEOUT":
      return `cannot connect to Postgres at ${target.host}: timed out (check DATABASE_URL and the network)`;
    case "ECONNRESET":
    case "CONNECTION_CLOSED":
    case "CONNECTION_ENDED":
    case "CONNECTION_DESTROYED":
      return `the connection to Postgres at ${target.host} was closed (${message})`;
    case "3D000":
      return `database "${target.database}" does not exist on ${target.host} (check DATABASE_URL)`;
    case "28P01":
    case "28000":
      return `Postgres at ${target.host} refused the login of role "${target.user}": ${message}`;
    case "42501":
      return `the database role "${target.user}" lacks a privilege this command needs: ${message} (grant it the operator privileges: runbooks/dead-letter-replay.md, "Database roles")`;
    case "3F000":
    case "42P01":
      return `the database has no Softcrum tables (${message}): is DATABASE_URL the module's database? Migrations are a deploy step (pnpm db:migrate)`;
    case "57P03":
    case "53300":
      return `Postgres at ${target.host} cannot take a connection now: ${message}`;
    default:
      return code ? `database error ${code}: ${message}` : `database error: ${message}`;
  }
}

/** The innermost cause: Drizzle wraps the driver's error (and puts the SQL in its own message). */
function rootOf(error: unknown): unknown {
  let current = error;
  for (let i = 0; i < 5; i++) {
    const cause = (current as { cause?: unknown })?.cause;
    if (cause === undefined || cause === null) break;
    current = cause;
  }
  return current;
}

/** Whether an error came from the database or the connection to it (not from the operations' own checks). */
export function isDatabaseError(error: unknown): boolean {
  const root = rootOf(error) as { code?: unknown; name?: unknown } | undefined;
  const wrapped = (error as { name?: unknown })?.name === "DrizzleQueryError";
  return (
    wrapped ||
    (typeof root?.code === "string" && /^([0-9A-Z]{5}|E[A-Z]+|CONNECT_TIMEOUT|CONNECTION_\w+)$/.test(root.code)) ||
    root?.name === "PostgresError"
  );
}
