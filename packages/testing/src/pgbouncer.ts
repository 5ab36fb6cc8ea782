import { execFileSync, spawn } from "node:child_process";
import {
  accessSync,
  chownSync,
  constants,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import postgres from "postgres";

/** One line: what to do when the tests need PgBouncer and it is not installed. */
export const NO_PGBOUNCER_MESSAGE =
  "pgbouncer not found: install it (Debian/Ubuntu: sudo apt-get install -y pgbouncer; macOS: brew install pgbouncer) " +
  "or set PGBOUNCER=/path/to/pgbouncer; the transaction-mode pooler tests need it.";

/** The pgbouncer binary: $PGBOUNCER, else on PATH, else where Debian puts it (/usr/sbin, not on a user's PATH). */
export function findPgBouncer(): string | undefined {
  const fromEnv = process.env["PGBOUNCER"];
  const dirs = (process.env["PATH"] ?? "").split(delimiter).filter(Boolean);
  const candidates = [
    ...(fromEnv ? [fromEnv] : []),
    ...dirs.map((dir) => join(dir, "pgbouncer")),
    "/usr/sbin/pgbouncer",
    "/usr/local/sbin/pgbouncer",
  ];
  return candidates.find((path) => {
    try {
      accessSync(path, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

export interface PgBouncerOptions {
  /** The Postgres PgBouncer forwards to. */
  readonly upstreamHost: string;
  readonly upstreamPort: number;
  /** The user clients log in as, and PgBouncer logs in upstream as (trust on both sides). @default "postgres" */
  readonly user?: string;
  /** Upstream password for `user`, when the server is not trust. @default none */
  readonly password?: string;
  /** Databases to expose; omitted, any database name is forwarded to the same name upstream. */
  readonly databases?: readonly string[];
  /** Server connections per (database, user): many clients share these few. @default 5 */
  readonly poolSize?: number;
}

export interface PgBouncer {
  readonly port: number;
  /** A connection URL for `database` through PgBouncer. */
  url(database: string): string;
  /** Stops PgBouncer and removes its directory; safe to call twice. */
  stop(): Promise<void>;
}

/** Options for `startPgBouncer` from a Postgres URL (host, port, user and password taken from it). */
export function upstreamOf(url: string): Pick<PgBouncerOptions, "upstreamHost" | "upstreamPort" | "user" | "password"> {
  const u = new URL(url);
  return {
    upstreamHost: u.hostname,
    upstreamPort: Number(u.port || 5432),
    user: decodeURIComponent(u.username || "postgres"),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
  };
}

/**
 * Starts a PgBouncer in transaction pool mode on a spare port of 127.0.0.1,
 * in front of the given Postgres, from an ini and auth file in a temp
 * directory of its own. PgBouncer refuses to run as root: as root it runs as
 * the `postgres` user (runuser), and the directory is handed to that user.
 * Resolves once a query goes through it.
 */
export async function startPgBouncer(options: PgBouncerOptions): Promise<PgBouncer> {
  const binary = findPgBouncer();
  if (!binary) throw new Error(NO_PGBOUNCER_MESSAGE);
  const user = options.user ?? "postgres";
  const asRoot = process.getuid?.() === 0;
  reapOrphans();
  const dir = mkdtempSync(join(tmpdir(), DIR_PREFIX));
  writeFileSync(join(dir, "owner.pid"), String(process.pid));
  if (asRoot) {
    try {
      const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"], { encoding: "utf8" }).trim());
      chownSync(dir, id("-u"), id("-g"));
    } catch (error) {
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`PgBouncer refuses to run as root, and it cannot run as user postgres: ${String(error)}`);
    }
  }

  let lastError: unknown;
  // A spare port can be taken between finding it and PgBouncer binding it: try another.
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const port = await sparePort();
    const ini = join(dir, "pgbouncer.ini");
    for (const file of ["pgbouncer.log", "pgbouncer.pid"]) rmSync(join(dir, file), { force: true });
    writeFileSync(ini, iniText(options, user, dir, port));
    writeFileSync(join(dir, "userlist.txt"), `${quoted(user)} ${quoted(options.password ?? "")}\n`);
    const command = asRoot ? "runuser" : binary;
    const args = asRoot ? ["-u", "postgres", "--", binary, "-d", ini] : ["-d", ini];
    try {
      // With -d it forks and exits 0 at once, even when it cannot listen later.
      await run(command, args);
      const url = urlFor(port, user, options.password);
      const pid = await waitUntilReady(url(options.databases?.[0] ?? "postgres"), dir);
      return handle(dir, port, pid, url);
    } catch (error) {
      lastError = error;
    }
  }
  rmSync(dir, { recursive: true, force: true });
  throw lastError;
}

const DIR_PREFIX = "softcrum-pgbouncer-";

/**
 * Stops the PgBouncers of test processes that died without stop() (killed,
 * interrupted), found by their directories: a daemon outlives its test run.
 * Only a pid that still runs pgbouncer is signalled (Linux /proc; elsewhere
 * nothing is reaped).
 */
function reapOrphans(): void {
  let entries: string[];
  try {
    entries = readdirSync(tmpdir()).filter((name) => name.startsWith(DIR_PREFIX));
  } catch {
    return;
  }
  for (const name of entries) {
    const dir = join(tmpdir(), name);
    const read = (file: string) => {
      try {
        return Number(readFileSync(join(dir, file), "utf8").trim()) || undefined;
      } catch {
        return undefined;
      }
    };
    const owner = read("owner.pid");
    if (owner === undefined || alive(owner)) continue;
    const pid = read("pgbouncer.pid");
    let command = "";
    try {
      if (pid) command = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    } catch {}
    if (pid && command.includes("pgbouncer")) signal(pid, "SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

function urlFor(port: number, user: string, password: string | undefined): (database: string) => string {
  const auth = `${encodeURIComponent(user)}${password ? `:${encodeURIComponent(password)}` : ""}`;
  return (database) => `postgres://${auth}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
}

function iniText(options: PgBouncerOptions, user: string, dir: string, port: number): string {
  const upstream = (database: string) =>
    [
      `host=${options.upstreamHost}`,
      `port=${options.upstreamPort}`,
      `user=${user}`,
      ...(options.password ? [`password=${options.password}`] : []),
      ...(database ? [`dbname=${database}`] : []),
    ].join(" ");
  const databases = options.databases?.length
    ? options.databases.map((name) => `${iniName(name)} = ${upstream(name)}`)
    : [`* = ${upstream("")}`];
  return [
    "[databases]",
    ...databases,
    "",
    "[pgbouncer]",
    "listen_addr = 127.0.0.1",
    `listen_port = ${port}`,
    "unix_socket_dir =",
    "auth_type = trust",
    `auth_file = ${join(dir, "userlist.txt")}`,
    "pool_mode = transaction",
    `default_pool_size = ${options.poolSize ?? 5}`,
    "min_pool_size = 0",
    "reserve_pool_size = 0",
    "max_client_conn = 500",
    // No ignore_startup_parameters: a client sending a startup parameter a
    // stock PgBouncer refuses (e.g. statement_timeout) must fail here too.
    `pidfile = ${join(dir, "pgbouncer.pid")}`,
    `logfile = ${join(dir, "pgbouncer.log")}`,
    "",
  ].join("\n");
}

function handle(dir: string, port: number, pid: number, url: (database: string) => string): PgBouncer {
  let stopped: Promise<void> | undefined;
  // If the test process exits without stop() (a crash, an interrupted run), do not leave a daemon behind.
  const onExit = () => signal(pid, "SIGTERM");
  process.once("exit", onExit);
  return {
    port,
    url,
    stop() {
      stopped ??= (async () => {
        process.removeListener("exit", onExit);
        signal(pid, "SIGTERM");
        await waitForExit(pid);
        rmSync(dir, { recursive: true, force: true });
      })();
      return stopped;
    },
  };
}

/**
 * Waits until this PgBouncer wrote its pid file, logged that it is up, and a
 * query goes through it; gives its pid. A FATAL in its log (e.g. the port was taken
 * meanwhile) fails at once, and whatever did start is stopped.
 */
async function waitUntilReady(url: string, dir: string): Promise<number> {
  const deadline = Date.now() + 10_000;
  const read = (file: string) => {
    try {
      return readFileSync(join(dir, file), "utf8");
    } catch {
      return "";
    }
  };
  let problem = "not started";
  for (;;) {
    const pid = Number(read("pgbouncer.pid").trim()) || undefined;
    const log = read("pgbouncer.log");
    if (log.includes(" FATAL ") || Date.now() > deadline) {
      if (pid) {
        signal(pid, "SIGTERM");
        await waitForExit(pid);
      }
      const tail = log.trim().split("\n").slice(-5).join("\n");
      throw new Error(`PgBouncer did not start (${problem}); its log ends:\n${tail}`);
    }
    // "process up" comes after it bound the port: before it, a query could reach whatever else listens there.
    if (pid && alive(pid) && log.includes(" process up: ")) {
      const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
      try {
        await sql`select 1`;
        return pid;
      } catch (error) {
        problem = error instanceof Error ? error.message : String(error);
      } finally {
        await sql.end({ timeout: 1 });
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // already gone
  }
}

async function waitForExit(pid: number): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (alive(pid) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
  if (alive(pid)) signal(pid, "SIGKILL");
}

function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 ? resolve() : reject(new Error(`${command} ${args.join(" ")} exited with ${code}: ${stderr.trim()}`)),
    );
  });
}

function sparePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** PgBouncer 1.18 reads no quoting in [databases] keys. */
function iniName(name: string): string {
  if (!/^[A-Za-z0-9_.-]+$/.test(name))
    throw new Error(`startPgBouncer: database name ${JSON.stringify(name)} needs quoting`);
  return name;
}

function quoted(value: string): string {
  return `"${value.replaceAll('"', '""')}"`;
}
