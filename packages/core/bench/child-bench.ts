import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

/**
 * The benchmarks `pnpm bench` (harness.bench.ts) runs each in a process of its
 * own, in this order, spreading the keys of each one's last JSON line into its
 * result. A child of its own because each needs it: a full GC
 * (`--expose-gc`) and memory or open handles that are the child's alone, or
 * processes and timing nothing else in the bench's process disturbs.
 * `BENCH_SKIP=limits,fanout` skips children by name; `SOAK_JOBS=0` skips the soak.
 * Each child reads its own size options from the environment (FANOUT_TENANTS,
 * LIMITS_SECONDS, SOAK_JOBS, ...), which it inherits.
 */
export const CHILD_BENCHES: readonly ChildBench[] = [
  // Rate limits (#20): a provider limit of 10/s shared by 3 worker processes; limits_* keys.
  { name: "limits", file: "limits.bench.ts" },
  // Fan-out (#20): one tick over 100,000 tenants run twice at once; fanout_* keys.
  { name: "fanout", file: "fanout.bench.ts", nodeArgs: ["--expose-gc"] },
  // Lanes (#20): a marketing stream and a 5,000-job transactional burst; lanes_* keys.
  { name: "lanes", file: "lanes.bench.ts" },
  // The soak (#12 item 4): SOAK_JOBS jobs (default 1,000,000); soak_* keys. Last: it is the longest.
  { name: "soak", file: "soak.bench.ts", nodeArgs: ["--expose-gc"], skip: () => process.env["SOAK_JOBS"] === "0" },
];

export interface ChildBench {
  /** What BENCH_SKIP names it by. */
  readonly name: string;
  /** Its file, relative to bench/. Its last line printed must be one JSON object. */
  readonly file: string;
  /** Node options before `--import tsx`, e.g. `["--expose-gc"]`. */
  readonly nodeArgs?: readonly string[];
  /** True when the environment asks to skip it (besides BENCH_SKIP). */
  readonly skip?: () => boolean;
}

/**
 * Runs bench/`file` in a process of its own (`node [nodeArgs] --import tsx`,
 * from packages/core), passing its output through, and returns the keys of
 * its last line, which must be a JSON object. Throws when it exits non-zero
 * or its last line is not JSON.
 */
export async function runChildBench(file: string, nodeArgs: readonly string[] = []): Promise<Record<string, number>> {
  const script = fileURLToPath(new URL(`./${file}`, import.meta.url));
  const child = spawn(process.execPath, [...nodeArgs, "--import", "tsx", script], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.on("data", (chunk: Buffer) => {
    out += chunk.toString();
    process.stdout.write(chunk);
  });
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  const last = out.trim().split("\n").at(-1) ?? "";
  if (code !== 0 || !last.startsWith("{")) throw new Error(`bench/${file} failed (exit ${code})`);
  return JSON.parse(last) as Record<string, number>;
}

/** Runs every child of CHILD_BENCHES not skipped, in order, and returns their keys together. */
export async function runChildBenches(): Promise<Record<string, number>> {
  const skipped = new Set((process.env["BENCH_SKIP"] ?? "").split(",").map((name) => name.trim()));
  let keys: Record<string, number> = {};
  for (const child of CHILD_BENCHES) {
    if (skipped.has(child.name) || child.skip?.()) continue;
    keys = { ...keys, ...(await runChildBench(child.file, child.nodeArgs)) };
  }
  return keys;
}
