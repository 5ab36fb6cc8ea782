/**
 * The job id of one tenant's job of one fan-out tick (#20 item 3, SPEC §7):
 * derived from (kind, tenant, tick), so a tick run again — a retried cron,
 * two schedulers, a replayed tick — publishes the same job_ids, and the
 * consumer's fence makes every copy after the first a no-op. Still a valid
 * UUID v7 (the harness refuses any other job_id): its time is the tick's,
 * its 74 other bits come from a sha256 of the three.
 */
import { createHash } from "node:crypto";
import { InvalidConfigError } from "../errors.ts";

/** The largest time a UUID v7 carries (48 bits of ms). */
const MAX_UUID_V7_MS = 2 ** 48 - 1;

export function fanOutJobId(input: { readonly kind: string; readonly tenantId: string; readonly tick: Date }): string {
  const ms = input.tick instanceof Date ? input.tick.getTime() : Number.NaN;
  if (!Number.isInteger(ms) || ms < 0 || ms > MAX_UUID_V7_MS) {
    throw new InvalidConfigError(`fan-out job id: tick must be a valid Date after 1970, got ${String(input.tick)}`);
  }
  if (
    typeof input.kind !== "string" ||
    input.kind === "" ||
    typeof input.tenantId !== "string" ||
    input.tenantId === ""
  ) {
    throw new InvalidConfigError("fan-out job id: kind and tenantId must be non-empty strings");
  }
  const hash = createHash("sha256")
    .update(JSON.stringify([input.kind, input.tenantId, ms]))
    .digest();
  const bytes = Buffer.alloc(16);
  bytes.writeUIntBE(ms, 0, 6);
  hash.copy(bytes, 6, 0, 10);
  bytes[6] = 0x70 | ((bytes[6] as number) & 0x0f); // version 7
  bytes[8] = 0x80 | ((bytes[8] as number) & 0x3f); // variant 10
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
