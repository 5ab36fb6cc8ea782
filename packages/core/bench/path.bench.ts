/**
 * `pnpm --filter @softcrum/core bench:path`: the single-job path alone — the
 * four variants of bench/path-variants.ts, interleaved over ROUNDS rounds in
 * one process, each job's rate and this process's CPU per job (user +
 * system, which counts the socket writes: on loopback TCP the kernel does the
 * receiving side's work in the sender's write). No cleanup, replay or child
 * benchmarks: the part of `pnpm bench` item 2 of #23 is about, in a minute.
 * The last line is JSON: `{"<variant>_jobs_per_s", "<variant>_cpu_us_per_job"
 * and "<variant>_cpu_sys_us_per_job" (the kernel's part) for each variant, "ratio_raw", "ratio_raw_drizzle_query", "ratio_raw_prepared"
 * (raw ÷ harness with a prepared query, rates), "cpu_ratio_raw",
 * "cpu_ratio_raw_prepared" (harness ÷ raw, CPU per job)}`.
 */
import { benchDatabase } from "./bench-database.ts";
import { CONCURRENCY, makeBodies, pathVariants, timed, type Variant } from "./path-variants.ts";

const JOBS = Number(process.env["BENCH_JOBS"] ?? 20_000);
const ROUNDS = 10;
const WARMUP = 500;

const bench = await benchDatabase("path", CONCURRENCY);
try {
  const { variants } = pathVariants(bench.sql);
  // BENCH_VARIANTS=harness,raw_postgresjs runs only those (to profile one alone).
  const only = process.env["BENCH_VARIANTS"]?.split(",");
  const names = (Object.keys(variants) as Variant[]).filter((n) => !only || only.includes(n));
  for (const name of names) await timed(makeBodies(WARMUP), variants[name]);

  const bodies = Object.fromEntries(names.map((n) => [n, makeBodies(JOBS)])) as Record<Variant, string[]>;
  const elapsed = Object.fromEntries(names.map((n) => [n, 0])) as Record<Variant, number>;
  const cpuUs = Object.fromEntries(names.map((n) => [n, 0])) as Record<Variant, number>;
  const sysUs = Object.fromEntries(names.map((n) => [n, 0])) as Record<Variant, number>;
  const perRound = Math.ceil(JOBS / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    const order = names.map((_, i) => names[(i + round) % names.length] as Variant);
    for (const name of order) {
      const cpu = process.cpuUsage();
      elapsed[name] += await timed(bodies[name].slice(round * perRound, (round + 1) * perRound), variants[name]);
      const used = process.cpuUsage(cpu);
      cpuUs[name] += used.user + used.system;
      sysUs[name] += used.system;
    }
  }
  const [check] = await bench.sql<{ n: number }[]>`select count(*)::int as n from bench_ledger`;
  const expected = (JOBS + WARMUP) * names.length;
  if (check?.n !== expected) throw new Error(`ledger has ${check?.n} rows, expected ${expected}`);

  const result: Record<string, number> = {};
  for (const name of names) {
    result[`${name}_jobs_per_s`] = Math.round((JOBS / elapsed[name]) * 1000);
    result[`${name}_cpu_us_per_job`] = Math.round(cpuUs[name] / JOBS);
    result[`${name}_cpu_sys_us_per_job`] = Math.round(sysUs[name] / JOBS);
  }
  if (names.length === Object.keys(variants).length) {
    result["ratio_raw"] = Number((elapsed.raw_postgresjs / elapsed.harness).toFixed(3));
    result["ratio_raw_drizzle_query"] = Number((elapsed.raw_postgresjs_drizzle_query / elapsed.harness).toFixed(3));
    result["ratio_raw_prepared"] = Number((elapsed.raw_postgresjs / elapsed.harness_prepared).toFixed(3));
    result["cpu_ratio_raw"] = Number((cpuUs.harness / cpuUs.raw_postgresjs).toFixed(3));
    result["cpu_ratio_raw_prepared"] = Number((cpuUs.harness_prepared / cpuUs.raw_postgresjs).toFixed(3));
  }
  console.log(`jobs per variant: ${JOBS}, concurrency ${CONCURRENCY}, ${ROUNDS} interleaved rounds`);
  console.log(JSON.stringify(result));
} finally {
  await bench.drop();
}
