/**
 * `pnpm --filter @softcrum/ops-cli bench`: how fast the operator CLI starts
 * (#10 item 13), the installed bin (compiled JS, plain Node) against the
 * TypeScript source through tsx, interleaved, `--help` so no database is
 * involved. The last line printed is JSON: medians in ms and their ratio.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const RUNS = Number(process.env["BENCH_RUNS"] ?? 15);
const BIN = fileURLToPath(new URL("../bin/softcrum-ops.mjs", import.meta.url));
const SOURCE = fileURLToPath(new URL("../src/cli.ts", import.meta.url));

execFileSync(process.execPath, [fileURLToPath(new URL("../build.mjs", import.meta.url))]);

function time(args: string[]): number {
  const start = process.hrtime.bigint();
  const result = spawnSync(process.execPath, args, { stdio: "ignore", env: { ...process.env, NODE_OPTIONS: "" } });
  if (result.status !== 0) throw new Error(`${args.join(" ")} exited ${result.status}`);
  return Number(process.hrtime.bigint() - start) / 1e6;
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number;
const bin: number[] = [];
const tsx: number[] = [];
for (let i = 0; i < RUNS; i++) {
  bin.push(time([BIN, "--help"]));
  tsx.push(time(["--import", "tsx", SOURCE, "--help"]));
}
const result = {
  cli_start_ms: Math.round(median(bin)),
  cli_start_tsx_ms: Math.round(median(tsx)),
  cli_start_ratio: Number((median(bin) / median(tsx)).toFixed(2)),
};
console.log(`operator CLI start (median of ${RUNS}): bin ${result.cli_start_ms} ms, tsx ${result.cli_start_tsx_ms} ms`);
console.log(JSON.stringify(result));
