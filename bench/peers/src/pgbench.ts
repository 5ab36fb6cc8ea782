/**
 * `pgbench`: the ceiling — the harness's transaction shape with no job system
 * around it. spec.concurrency clients (16), prepared statements, each
 * transaction: BEGIN; the fence insert `ON CONFLICT DO NOTHING` into `fence`
 * (the columns and key of `core.processed_jobs`); the effect insert; COMMIT.
 * The job id is drawn by pgbench (`random()` over 63 bits, made a uuid by the
 * server the same way in both inserts), so no extra round trip fetches one.
 * ceil(N / clients) transactions per client; the rate is pgbench's own tps
 * (without connection time); client CPU is pgbench's, from the shell's `times`.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import type { RunSpec, Sample } from "./config.ts";
import { expectEffects, sampleOf, startMeter, withFreshDatabases } from "./measure.ts";

const SCRIPT = `\\set id random(1, 9223372036854775806)
\\set amount random(0, 99)
BEGIN;
INSERT INTO fence (job_id, consumer) VALUES (lpad(to_hex(:id::bigint), 32, '0')::uuid, 'pgbench') ON CONFLICT DO NOTHING;
INSERT INTO effects (job_id, amount) VALUES (lpad(to_hex(:id::bigint), 32, '0')::uuid, :amount);
COMMIT;
`;

const FENCE_DDL = `create table fence (
  job_id uuid not null,
  consumer text not null,
  processed_at timestamptz not null default now(),
  primary key (job_id, consumer)
)`;

interface PgbenchRun {
  readonly tps: number;
  readonly wallMs: number;
  /** pgbench's own CPU (user + system), µs; null when the shell's `times` could not be read. */
  readonly cpuUs: number | null;
}

/** `1m2.500s` → µs. */
function shellTime(text: string): number {
  const match = /^(\d+)m([\d.]+)s$/.exec(text);
  if (!match) return Number.NaN;
  return (Number(match[1]) * 60 + Number(match[2])) * 1_000_000;
}

/** Runs pgbench under bash, whose `times` then prints its children's CPU. */
async function pgbench(spec: RunSpec, database: string, script: string, perClient: number): Promise<PgbenchRun> {
  const binary = spec.pgbench;
  if (!binary) throw new Error("pgbench: no binary");
  const url = new URL(spec.adminUrl);
  const clients = spec.concurrency;
  const threads = Math.max(1, Math.min(clients, availableParallelism()));
  const args = ["-n", "-M", "prepared", "-c", `${clients}`, "-j", `${threads}`, "-t", `${perClient}`, "-f", script];
  const env = {
    ...process.env,
    PGHOST: decodeURIComponent(url.hostname),
    PGPORT: url.port || "5432",
    PGUSER: decodeURIComponent(url.username) || "postgres",
    PGDATABASE: database,
    ...(url.password ? { PGPASSWORD: decodeURIComponent(url.password) } : {}),
  };
  const started = performance.now();
  const child = spawn("bash", ["-c", '"$0" "$@"; code=$?; echo "@@times"; times; exit $code', binary, ...args], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout.on("data", (chunk: Buffer) => {
    out += chunk.toString();
  });
  child.stderr.on("data", (chunk: Buffer) => {
    err += chunk.toString();
  });
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", resolve);
  });
  const wallMs = performance.now() - started;
  if (code !== 0) throw new Error(`pgbench exited ${code}: ${err.trim() || out.trim()}`);
  const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(out)?.[1];
  if (!tps) throw new Error(`pgbench: no tps in its output:\n${out}`);
  // After the marker: the shell's own times, then its children's ("0m1.234s 0m0.567s").
  const children = out.split("@@times")[1]?.trim().split("\n")[1]?.trim().split(/\s+/) ?? [];
  const cpuUs = children.length === 2 ? shellTime(children[0] ?? "") + shellTime(children[1] ?? "") : Number.NaN;
  return { tps: Number(tps), wallMs, cpuUs: Number.isFinite(cpuUs) ? cpuUs : null };
}

export function runPgbench(spec: RunSpec): Promise<Sample> {
  return withFreshDatabases(spec, [{ label: spec.system, effects: true }], async ([database]) => {
    if (!database) throw new Error("no database");
    const sql = postgres(database.url, { max: 1, onnotice: () => {} });
    try {
      await sql.unsafe(FENCE_DDL);
    } finally {
      await sql.end({ timeout: 5 });
    }
    const dir = mkdtempSync(join(tmpdir(), "softcrum-peers-pgbench-"));
    try {
      const script = join(dir, "harness-shape.sql");
      writeFileSync(script, SCRIPT);
      const warmupPerClient = Math.ceil(spec.warmup / spec.concurrency);
      const perClient = Math.ceil(spec.jobs / spec.concurrency);
      await pgbench(spec, database.name, script, warmupPerClient);

      const meter = await startMeter(database.url);
      const run = await pgbench(spec, database.name, script, perClient);
      const costs = await meter.stop();
      const transactions = perClient * spec.concurrency;
      await expectEffects(database.url, transactions + warmupPerClient * spec.concurrency, spec.system);
      const sample = sampleOf(spec.system, transactions, run.wallMs, costs, run.cpuUs);
      // pgbench's own rate: its clock starts once its clients are connected.
      return { ...sample, jobsPerS: run.tps };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
