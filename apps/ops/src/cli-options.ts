/**
 * The ops CLI's options and what they are read into: the dead-letter filter
 * flags, the approval threshold from the environment, and the one-line
 * failure with its exit code. Moved by role from cli.ts.
 */
import { DEFAULT_BATCH_POLICY, type DeadLetterFilter } from "@softcrum/core/ops";
import type { Command } from "commander";
import { EXIT } from "./output.ts";

/** A failure the CLI reports as one line with its own exit code. */
export class ExitError extends Error {
  constructor(
    readonly exitCode: number,
    message: string,
  ) {
    super(message);
  }
}

export function batchPolicyFromEnv(): { approvalThreshold?: number } {
  const raw = process.env["SOFTCRUM_OPS_APPROVAL_THRESHOLD"];
  if (raw === undefined || raw === "") return {};
  const threshold = Number(raw);
  // It can only make approval stricter: whoever runs the CLI must not be able to skip the second operator.
  if (!Number.isInteger(threshold) || threshold < 0 || threshold > DEFAULT_BATCH_POLICY.approvalThreshold) {
    throw new ExitError(
      EXIT.usage,
      `SOFTCRUM_OPS_APPROVAL_THRESHOLD must be a whole number from 0 to ${DEFAULT_BATCH_POLICY.approvalThreshold}, got ${raw}`,
    );
  }
  return { approvalThreshold: threshold };
}

export const filterOptions = (command: Command) =>
  command
    .option("--queue <name>", "only this queue")
    .option("--consumer <name>", "only this consumer")
    .option("--tenant <id>", "only this tenant")
    .option("--kind <kind>", "only this envelope kind")
    .option("--class <errorClass>", "poison | exhausted | permanent | expired")
    .option("--created-after <time>", "created at or after (ISO 8601 with an offset, e.g. 2026-11-29T08:00:00Z)")
    .option("--created-before <time>", "created before (ISO 8601 with an offset)")
    .option("--since <time>", "same as --created-after")
    .option("--until <time>", "same as --created-before");

const FILTER_FLAGS = {
  queue: "--queue",
  consumer: "--consumer",
  tenantId: "--tenant",
  kind: "--kind",
  errorClass: "--class",
  status: "--status",
  limit: "--limit",
  cursor: "--cursor",
};

/** The filter the flags give, and which flag the operator typed for each field (errors name it). */
export function readFilter(
  o: Record<string, string | undefined>,
  withStatus = true,
): { filter: DeadLetterFilter; flags: Record<string, string> } {
  const f: Record<string, string> = {};
  const flags: Record<string, string> = { ...FILTER_FLAGS };
  const put = (key: string, value: string | undefined) => {
    if (value !== undefined) f[key] = value;
  };
  put("queue", o["queue"]);
  put("consumer", o["consumer"]);
  put("tenantId", o["tenant"]);
  put("kind", o["kind"]);
  put("errorClass", o["class"]);
  if (withStatus) put("status", o["status"]);
  for (const [field, long, short] of [
    ["createdAfter", "createdAfter", "since"],
    ["createdBefore", "createdBefore", "until"],
  ] as const) {
    const longFlag = `--${field === "createdAfter" ? "created-after" : "created-before"}`;
    if (o[long] !== undefined && o[short] !== undefined) {
      throw new ExitError(EXIT.usage, `give ${longFlag} or --${short}, not both (they are the same filter)`);
    }
    put(field, o[long] ?? o[short]);
    // Errors name the flag the operator typed.
    flags[field] = o[short] !== undefined ? `--${short}` : longFlag;
  }
  return { filter: f as DeadLetterFilter, flags };
}
