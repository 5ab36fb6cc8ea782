/**
 * What every system's run shares: a fresh database it creates and drops, the
 * `effects` table each job writes one row to, the meter (client CPU,
 * transaction ids and WAL, the last two cluster-wide), and the checks.
 */
import { uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import postgres from "postgres";
import type { RunSpec, Sample } from "./config.ts";

/** The one row each job writes. A second copy of a job would fail on the primary key. */
export const effects = pgTable("effects", {
  jobId: uuid("job_id").primaryKey(),
  amount: integer("amount").notNull(),
});

export const EFFECTS_DDL = "create table effects (job_id uuid primary key, amount integer not null)";

/** A job's data, the same for every system. */
export interface JobData {
  readonly jobId: string;
  readonly amount: number;
}

export interface FreshDatabase {
  readonly name: string;
  readonly url: string;
  /** Drops the database, closing whatever is still connected to it. */
  drop(): Promise<void>;
}

/**
 * Creates `softcrum_peers_<label>_<round>_<random>` on the server, with the
 * effects table unless `effectsTable` is false.
 */
export async function freshDatabase(spec: RunSpec, label: string, effectsTable = true): Promise<FreshDatabase> {
  const name = uniqueDatabaseName("softcrum_peers", `${label}_${spec.round}`);
  await withAdmin(spec.adminUrl, (admin) => admin`create database ${admin(name)}`);
  const url = withDatabase(spec.adminUrl, name);
  if (effectsTable) {
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    try {
      await sql.unsafe(EFFECTS_DDL);
    } finally {
      await sql.end({ timeout: 5 });
    }
  }
  return {
    name,
    url,
    async drop() {
      await withAdmin(spec.adminUrl, (admin) => admin`drop database if exists ${admin(name)} with (force)`);
    },
  };
}

/** Creates the databases `labels` names, runs `work`, and drops them all whatever happens. */
export async function withFreshDatabases<T>(
  spec: RunSpec,
  labels: readonly { label: string; effects: boolean }[],
  work: (databases: FreshDatabase[]) => Promise<T>,
): Promise<T> {
  const databases: FreshDatabase[] = [];
  try {
    for (const { label, effects: withEffects } of labels) databases.push(await freshDatabase(spec, label, withEffects));
    return await work(databases);
  } finally {
    // The forced drop ends every backend still connected, and a client an
    // SDK kept idle past its stop() (graphile-worker's, once in a while) then
    // emits 'error' with no listener: 57P01, after the run was measured and
    // checked. Only that error is heard here, only while dropping.
    const terminated = (error: unknown) => {
      if ((error as { code?: unknown } | null)?.code !== "57P01") throw error;
    };
    process.on("uncaughtException", terminated);
    try {
      for (const database of databases) await database.drop();
      // An idle client's error arrives on its socket's next read, after the drop answered.
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      process.off("uncaughtException", terminated);
    }
  }
}

/** Counts effect rows; throws unless there are exactly `expected`. */
export async function expectEffects(url: string, expected: number, system: string): Promise<void> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from effects`;
    if (row?.n !== expected) {
      throw new Error(`${system}: effects has ${row?.n} rows, expected exactly ${expected} (jobs + warm-up)`);
    }
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** What the meter measured between `start` and `stop`. */
export interface Costs {
  /** µs of this process's CPU (user + system). */
  readonly cpuUs: number;
  /** Transaction ids assigned in the whole cluster, the meter's own excluded. */
  readonly writeTxns: number;
  /** Bytes of WAL written in the whole cluster. */
  readonly walBytes: number;
}

/**
 * Cluster-wide counters, read on a connection of the meter's own:
 * `pg_current_xact_id()` (assigns the reading transaction an id: the meter
 * subtracts its own) and `pg_current_wal_lsn()`. Whatever else runs on the
 * server meanwhile is counted too.
 */
export async function startMeter(url: string): Promise<{ stop(): Promise<Costs> }> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const [before] = await sql<{ xid: string; lsn: string }[]>`
    select pg_current_xact_id()::text as xid, pg_current_wal_lsn()::text as lsn`;
  if (!before) throw new Error("meter: no answer");
  const cpu = process.cpuUsage();
  return {
    async stop() {
      const used = process.cpuUsage(cpu);
      try {
        const [after] = await sql<{ txns: string; wal: string }[]>`
          select (pg_current_xact_id()::text::bigint - ${before.xid}::bigint - 1)::text as txns,
                 pg_wal_lsn_diff(pg_current_wal_lsn(), ${before.lsn}::pg_lsn)::bigint::text as wal`;
        return { cpuUs: used.user + used.system, writeTxns: Number(after?.txns), walBytes: Number(after?.wal) };
      } finally {
        await sql.end({ timeout: 5 });
      }
    },
  };
}

/** A sample from a timed run of `jobs` jobs and what the meter saw. */
export function sampleOf(
  system: Sample["system"],
  jobs: number,
  ms: number,
  costs: Costs,
  cpuUs: number | null = costs.cpuUs,
): Sample {
  return {
    system,
    jobs,
    seconds: ms / 1000,
    jobsPerS: (jobs / ms) * 1000,
    cpuUsPerJob: cpuUs === null ? null : cpuUs / jobs,
    writeTxnsPerJob: costs.writeTxns / jobs,
    walBytesPerJob: costs.walBytes / jobs,
  };
}

/** Counts jobs done in this process and wakes whoever waits for a number of them. */
export class Progress {
  #done = 0;
  #waiters: { target: number; resolve: () => void }[] = [];
  #failure: Error | undefined;
  #failureWaiters: ((error: Error) => void)[] = [];

  get done(): number {
    return this.#done;
  }

  add(count = 1): void {
    this.#done += count;
    this.#waiters = this.#waiters.filter((waiter) => {
      if (this.#done < waiter.target) return true;
      waiter.resolve();
      return false;
    });
  }

  /** A job failed where no system should fail: the wait rejects with it. */
  fail(error: unknown): void {
    this.#failure ??= error instanceof Error ? error : new Error(String(error));
    for (const reject of this.#failureWaiters) reject(this.#failure);
    this.#failureWaiters = [];
  }

  /** Resolves when `target` jobs are done; rejects on a failure or after `timeoutMs`. */
  waitFor(target: number, timeoutMs: number, what: string): Promise<void> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#done >= target) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`${what}: ${this.#done} of ${target} jobs done after ${timeoutMs} ms`)),
        timeoutMs,
      );
      this.#waiters.push({
        target,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
      this.#failureWaiters.push((error) => {
        clearTimeout(timer);
        reject(error);
      });
    });
  }
}

/** Polls `query` (one number) until it returns `target`; throws after `timeoutMs`. */
export async function pollUntil(
  url: string,
  query: string,
  target: number,
  timeoutMs: number,
  what: string,
): Promise<void> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const [row] = await sql.unsafe<{ n: number }[]>(query);
      if (Number(row?.n) === target) return;
      if (Date.now() > deadline) throw new Error(`${what}: still ${row?.n}, waiting for ${target}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** A bound on a run that should take seconds: generous, so that only a stuck system trips it. */
export function timeoutFor(jobs: number): number {
  return 60_000 + jobs * 10;
}
