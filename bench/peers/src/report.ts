/**
 * From the rounds' samples to what `pnpm bench:peers` prints: the median of
 * each measure across rounds, a table, and the one-line JSON result.
 */
import { ALL_SYSTEMS, PEERS, type Sample, type SystemName } from "./config.ts";

/** What each system promises about a job's effect (bench/peers/README.md has the details). */
export const SEMANTICS: Record<SystemName, string> = {
  harness: "exactly-once effect (fence in the work transaction)",
  harness_batched: "exactly-once effect (fence in the work transaction)",
  graphile_worker: "at-least-once",
  pg_boss: "at-least-once",
  dbos: "exactly-once transaction step",
  pgbench: "no job system (ceiling)",
  raw_postgresjs: "no job system, no checks (postgres.js ceiling, 1 commit per job)",
};

export interface Summary {
  readonly system: SystemName;
  readonly rounds: readonly number[];
  readonly jobsPerS: number;
  readonly cpuUsPerJob: number | null;
  readonly writeTxnsPerJob: number;
  readonly walBytesPerJob: number;
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  if (sorted.length === 0) return Number.NaN;
  return sorted.length % 2 === 1
    ? (sorted[middle] as number)
    : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

export function summarize(samples: readonly Sample[]): Summary[] {
  return ALL_SYSTEMS.flatMap((system) => {
    const mine = samples.filter((sample) => sample.system === system);
    if (mine.length === 0) return [];
    const cpu = mine.map((sample) => sample.cpuUsPerJob).filter((value): value is number => value !== null);
    return [
      {
        system,
        rounds: mine.map((sample) => sample.jobsPerS),
        jobsPerS: median(mine.map((sample) => sample.jobsPerS)),
        cpuUsPerJob: cpu.length === 0 ? null : median(cpu),
        writeTxnsPerJob: median(mine.map((sample) => sample.writeTxnsPerJob)),
        walBytesPerJob: median(mine.map((sample) => sample.walBytesPerJob)),
      },
    ];
  });
}

const round0 = (value: number) => Math.round(value);
const round3 = (value: number) => Math.round(value * 1000) / 1000;

/** The table, one line per system that ran. */
export function table(summaries: readonly Summary[]): string {
  const header = ["system", "jobs/s", "per round", "CPU µs/job", "write txns/job", "WAL B/job", "semantics"];
  const rows = summaries.map((s) => [
    s.system,
    `${round0(s.jobsPerS)}`,
    s.rounds.map((rate) => round0(rate)).join(" / "),
    s.cpuUsPerJob === null ? "n/a" : `${round0(s.cpuUsPerJob)}`,
    s.writeTxnsPerJob.toFixed(3),
    `${round0(s.walBytesPerJob)}`,
    SEMANTICS[s.system],
  ]);
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => (row[i] ?? "").length)));
  // Names left-aligned, numbers right-aligned, the last column (text) unpadded.
  const cell = (text: string, i: number) =>
    i === 0 ? text.padEnd(widths[i] ?? 0) : i === header.length - 1 ? text : text.padStart(widths[i] ?? 0);
  const line = (cells: readonly string[]) => cells.map(cell).join("  ");
  return [line(header), line(widths.map((w) => "-".repeat(w))), ...rows.map(line)].join("\n");
}

/**
 * What a reference says, under the table (nothing when none ran): how far the
 * fastest peer is from the single-job ceiling of a postgres.js client, and
 * how close the harness's single job comes to that ceiling.
 */
export function notes(summaries: readonly Summary[]): string[] {
  const raw = summaries.find((s) => s.system === "raw_postgresjs");
  if (raw === undefined) return [];
  const peers = summaries.filter((s) => PEERS.includes(s.system));
  const best = peers.reduce<Summary | undefined>(
    (a, s) => (a === undefined || s.jobsPerS > a.jobsPerS ? s : a),
    undefined,
  );
  const harness = summaries.find((s) => s.system === "harness");
  const lines: string[] = [];
  if (best !== undefined) {
    lines.push(`raw_postgresjs / best peer (${best.system}): ${round3(raw.jobsPerS / best.jobsPerS)}`);
  }
  if (harness !== undefined) lines.push(`harness / raw_postgresjs: ${round3(harness.jobsPerS / raw.jobsPerS)}`);
  return lines;
}

/** The last line of `pnpm bench:peers`: exactly these keys, null for what did not run. */
export function result(summaries: readonly Summary[]) {
  const of = (system: SystemName) => summaries.find((s) => s.system === system);
  const rate = (system: SystemName) => {
    const s = of(system);
    return s ? round0(s.jobsPerS) : null;
  };
  const peerRates = PEERS.map((system) => of(system)?.jobsPerS).filter((r): r is number => r !== undefined);
  const best = peerRates.length > 0 ? Math.max(...peerRates) : undefined;
  const ratio = (a: number | undefined, b: number | undefined) =>
    a === undefined || b === undefined || b === 0 ? null : round3(a / b);
  const perSystem = (pick: (s: Summary) => number | null) =>
    Object.fromEntries(summaries.map((s) => [s.system, pick(s)]));
  return {
    harness_jobs_per_s: rate("harness"),
    harness_batched_jobs_per_s: rate("harness_batched"),
    graphile_worker_jobs_per_s: rate("graphile_worker"),
    pg_boss_jobs_per_s: rate("pg_boss"),
    dbos_jobs_per_s: rate("dbos"),
    pgbench_tps: rate("pgbench"),
    vs_best_peer: ratio(of("harness")?.jobsPerS, best),
    batched_vs_best_peer: ratio(of("harness_batched")?.jobsPerS, best),
    batched_vs_pgbench: ratio(of("harness_batched")?.jobsPerS, of("pgbench")?.jobsPerS),
    cpu_us_per_job: perSystem((s) => (s.cpuUsPerJob === null ? null : round0(s.cpuUsPerJob))),
    write_txns_per_job: perSystem((s) => round3(s.writeTxnsPerJob)),
    wal_bytes_per_job: perSystem((s) => round0(s.walBytesPerJob)),
  };
}
