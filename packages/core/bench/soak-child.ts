import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

/**
 * Runs bench/soak.bench.ts in a process of its own (a full GC needs
 * --expose-gc, and the open handles after close() must be the soak's alone),
 * passing its output through, and returns the keys of its JSON line.
 * SOAK_JOBS=0 skips it.
 */
export async function runSoak(): Promise<Record<string, number>> {
  if (process.env["SOAK_JOBS"] === "0") return {};
  const script = fileURLToPath(new URL("./soak.bench.ts", import.meta.url));
  const child = spawn(process.execPath, ["--expose-gc", "--import", "tsx", script], {
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
  if (code !== 0 || !last.startsWith("{")) throw new Error(`the soak failed (exit ${code})`);
  return JSON.parse(last) as Record<string, number>;
}
