import { type ChildProcess, spawn } from "node:child_process";

export interface ScriptResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** A script running in its own process, with the output it printed so far. */
export interface RunningScript {
  readonly child: ChildProcess;
  readonly stdout: () => string;
  readonly stderr: () => string;
}

/** Where and how a script runs. `tsx: false` for compiled JavaScript (an installed bin). */
export interface ScriptOptions {
  readonly env?: NodeJS.ProcessEnv;
  readonly cwd?: string;
  /** @default true */
  readonly tsx?: boolean;
}

/**
 * Starts a TypeScript entry point in its own Node process (through tsx), as a
 * person would run the command, collecting what it prints; for scripts that
 * run until told to stop.
 */
export function startScript(script: string, args: readonly string[] = [], options: ScriptOptions = {}): RunningScript {
  const loader = options.tsx === false ? [] : ["--import", "tsx"];
  const child = spawn(process.execPath, [...loader, script, ...args], {
    ...(options.cwd ? { cwd: options.cwd } : {}),
    env: options.env ?? process.env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (chunk) => {
    stdout += chunk;
  });
  child.stderr?.on("data", (chunk) => {
    stderr += chunk;
  });
  return { child, stdout: () => stdout, stderr: () => stderr };
}

/**
 * Runs a TypeScript entry point in its own Node process (through tsx), as a
 * person would run the command, and collects its exit code and output.
 */
export function runScript(script: string, args: readonly string[], options: ScriptOptions = {}): Promise<ScriptResult> {
  return new Promise((resolve, reject) => {
    const running = startScript(script, args, { ...options, env: { ...process.env, ...options.env } });
    running.child.on("error", reject);
    running.child.on("close", (code) => resolve({ code, stdout: running.stdout(), stderr: running.stderr() }));
  });
}
