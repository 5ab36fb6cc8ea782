import { execFile, execFileSync, spawnSync } from "node:child_process";
import { appendFileSync, chownSync, mkdtempSync, realpathSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import postgres from "postgres";

const run = promisify(execFile);

/**
 * A Postgres cluster of the test's own, for tests that must kill backends or
 * restart the server: never the shared server on 5432.
 */
export interface ThrowawayPostgres {
  /** postgres://postgres@127.0.0.1:PORT/postgres (trust auth). */
  readonly url: string;
  readonly port: number;
  /** The cluster's folder (data, log, unix socket), removed by stop(). */
  readonly dir: string;
  /**
   * `pg_ctl restart`: every backend is terminated, then the server accepts
   * connections again on the same port. `immediate` is a crash (no shutdown
   * checkpoint; the server recovers from its WAL on start). @default mode "fast"
   */
  restart(options?: { mode?: ShutdownMode }): Promise<void>;
  /** `pg_ctl stop`: the server is down (connections refused) until `start()`; its data is kept. @default mode "fast" */
  shutdown(options?: { mode?: ShutdownMode }): Promise<void>;
  /** Starts the server again after `shutdown()`, on the same port. */
  start(): Promise<void>;
  /**
   * Terminates (pg_terminate_backend) the client backends whose
   * application_name is `applicationName` and, when `inTransaction`, only those
   * inside a transaction of more than one statement (idle in it, or running a
   * later statement of it). Resolves with the pids it terminated.
   */
  terminateBackends(applicationName: string, options?: { inTransaction?: boolean }): Promise<number[]>;
  /** The server's log so far (for a failing test's message). */
  log(): string;
  /** Stops the server at once and removes its folder. Idempotent. */
  stop(): Promise<void>;
}

/** How `pg_ctl` stops the server: `fast` rolls back and disconnects every session; `immediate` kills them (crash recovery on the next start). */
export type ShutdownMode = "fast" | "immediate";

export interface ThrowawayPostgresOptions {
  /** Run against the new cluster's `postgres` database once it is up (e.g. the core migrations). */
  readonly migrate?: (url: string) => Promise<unknown>;
  /** Extra `postgresql.conf` settings. */
  readonly settings?: Readonly<Record<string, string | number>>;
}

/** Settings for speed, not durability: the cluster lives for one test file. */
const FAST_SETTINGS: Record<string, string | number> = {
  fsync: "off",
  synchronous_commit: "off",
  full_page_writes: "off",
  shared_buffers: "16MB",
  max_connections: 40,
  max_wal_size: "64MB",
  checkpoint_timeout: "30min",
  autovacuum: "off",
  log_min_messages: "warning",
  log_line_prefix: "'%m [%p] %a '",
};

/** Clusters started by this process and not yet stopped, for the exit hook. */
const live = new Set<{ dir: string; pgCtl: string }>();
let exitHookInstalled = false;

/**
 * Starts a fresh Postgres cluster with `initdb` and `pg_ctl` from the folder
 * `pg_config --bindir` prints, under a temp dir, listening on 127.0.0.1 only,
 * on a spare port. initdb and postgres refuse to run as root, so as root they
 * run as the `postgres` OS user (`runuser -u postgres --`), which owns the folder.
 * Call stop() when done (an exit hook also stops it if the process ends first).
 */
export async function startThrowawayPostgres(options: ThrowawayPostgresOptions = {}): Promise<ThrowawayPostgres> {
  let binDir: string;
  try {
    binDir = execFileSync("pg_config", ["--bindir"], { encoding: "utf8" }).trim();
  } catch (error) {
    throw new Error(
      "startThrowawayPostgres(): `pg_config --bindir` failed, so initdb and pg_ctl cannot be found; install the " +
        `PostgreSQL server binaries (Debian: apt-get install postgresql) (${(error as Error).message})`,
    );
  }
  const pgCtl = join(binDir, "pg_ctl");
  const asRoot = process.getuid?.() === 0;
  const dir = realpathSync(mkdtempSync(join(tmpdir(), "softcrum-pg-")));
  const data = join(dir, "data");
  const logFile = join(dir, "server.log");
  const entry = { dir, pgCtl };
  live.add(entry);
  installExitHook();
  const as = (command: string, args: string[]) =>
    asRoot ? { file: "runuser", args: ["-u", "postgres", "--", command, ...args] } : { file: command, args };
  const exec = async (command: string, args: string[]) => {
    const { file, args: argv } = as(command, args);
    try {
      await run(file, argv, { encoding: "utf8" });
    } catch (error) {
      const e = error as { stderr?: string; stdout?: string; message?: string };
      throw new Error(`${command} ${args.join(" ")} failed: ${e.stderr || e.stdout || e.message}\n${readLog(logFile)}`);
    }
  };

  try {
    if (asRoot) {
      const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }));
      const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }));
      chownSync(dir, uid, gid);
    }
    await exec(join(binDir, "initdb"), [
      "-D",
      data,
      "-U",
      "postgres",
      "--auth=trust",
      "--encoding=UTF8",
      "--locale=C",
      "--no-sync",
      "--no-instructions",
    ]);
    const settings = {
      ...FAST_SETTINGS,
      listen_addresses: "'127.0.0.1'",
      unix_socket_directories: `'${dir}'`,
      ...options.settings,
    };
    // Root may write the file postgres owns; its owner stays postgres.
    appendFileSync(
      join(data, "postgresql.conf"),
      `\n${Object.entries(settings)
        .map(([key, value]) => `${key} = ${value}`)
        .join("\n")}\n`,
    );

    // A port that was free a moment ago can be taken before the server binds it: try a few.
    let port = 0;
    for (let tries = 0; ; tries++) {
      port = await sparePort();
      try {
        await exec(pgCtl, ["start", "-D", data, "-l", logFile, "-w", "-t", "30", "-o", `-p ${port}`]);
        break;
      } catch (error) {
        if (tries >= 3) throw error;
      }
    }
    const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
    if (options.migrate) await options.migrate(url);

    let stopped = false;
    return {
      url,
      port,
      dir,
      async restart({ mode = "fast" } = {}) {
        await exec(pgCtl, ["restart", "-D", data, "-m", mode, "-w", "-t", "30", "-l", logFile, "-o", `-p ${port}`]);
      },
      async shutdown({ mode = "fast" } = {}) {
        await exec(pgCtl, ["stop", "-D", data, "-m", mode, "-w", "-t", "30"]);
      },
      async start() {
        await exec(pgCtl, ["start", "-D", data, "-l", logFile, "-w", "-t", "30", "-o", `-p ${port}`]);
      },
      async terminateBackends(applicationName, { inTransaction = false } = {}) {
        const sql = postgres(url, { max: 1, onnotice: () => {}, connection: { application_name: "throwaway-admin" } });
        try {
          // The filter runs first (a materialized CTE): in one WHERE the planner
          // may call pg_terminate_backend before the other conditions.
          const rows = await sql<{ pid: number }[]>`
            with chosen as materialized (
              select pid from pg_stat_activity
              where application_name = ${applicationName} and backend_type = 'client backend'
                and pid <> pg_backend_pid()
                and (${!inTransaction} or (xact_start is not null and (state <> 'active' or xact_start < query_start)))
            )
            select pid from chosen where pg_terminate_backend(pid)`;
          return rows.map((r) => r.pid);
        } finally {
          await sql.end({ timeout: 1 });
        }
      },
      log: () => readLog(logFile),
      async stop() {
        if (stopped) return;
        stopped = true;
        stopCluster(entry);
      },
    };
  } catch (error) {
    stopCluster(entry);
    throw error;
  }
}

function readLog(file: string): string {
  try {
    return execFileSync("tail", ["-n", "40", file], { encoding: "utf8" });
  } catch {
    return "";
  }
}

/** Synchronous, so the exit hook can use it: immediate shutdown, then the folder goes. */
function stopCluster(entry: { dir: string; pgCtl: string }): void {
  live.delete(entry);
  const data = join(entry.dir, "data");
  const args = ["stop", "-D", data, "-m", "immediate", "-w", "-t", "30"];
  const asRoot = process.getuid?.() === 0;
  spawnSync(asRoot ? "runuser" : entry.pgCtl, asRoot ? ["-u", "postgres", "--", entry.pgCtl, ...args] : args, {
    stdio: "ignore",
  });
  rmSync(entry.dir, { recursive: true, force: true });
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on("exit", () => {
    for (const entry of [...live]) stopCluster(entry);
  });
}

function sparePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => (port > 0 ? resolve(port) : reject(new Error("no spare port"))));
    });
  });
}
