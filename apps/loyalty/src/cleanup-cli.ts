// `pnpm fences:cleanup [--dry-run]`: runs the processed_jobs TTL cleanup once, by hand.
// DATABASE_URL is required; FENCE_TTL_HOURS (default 192) and SOFTCRUM_QUEUE as for the worker.
import { createFenceCleanup } from "@softcrum/core/maintenance";
import { createLoyaltyModule } from "./composition-root.ts";

const dryRun = process.argv.includes("--dry-run");
const unknown = process.argv.slice(2).filter((a) => a !== "--dry-run");
if (unknown.length > 0) {
  console.error(`unknown argument: ${unknown.join(" ")}\nusage: pnpm fences:cleanup [--dry-run]`);
  process.exit(2);
}
const databaseUrl = process.env["DATABASE_URL"];
if (!databaseUrl) {
  console.error("DATABASE_URL is not set: the cleanup works on the module's database");
  process.exit(2);
}
const hours = Number(process.env["FENCE_TTL_HOURS"] ?? 192);
const module = await createLoyaltyModule({ databaseUrl, notifier: { pointsAwarded: async () => {} } });
try {
  const transportHoldMs = module.transport === "vercel" ? 604_800_000 : 0;
  const cleanup = createFenceCleanup({
    db: module.db,
    ttlMs: hours * 3_600_000,
    consumers: module.consumers,
    transportHoldMs,
  });
  const report = await cleanup.run({ dryRun });
  console.log(
    dryRun
      ? `dry run: would delete ${report.deleted} fence rows older than ${hours} h; ${report.keptForPendingDeadLetters} expired rows are kept for pending dead letters, ${report.keptForReplays} for recent replays`
      : `deleted ${report.deleted} fence rows older than ${hours} h in ${report.batches} batches (${report.durationMs} ms); kept ${report.keptForPendingDeadLetters} for pending dead letters and ${report.keptForReplays} for recent replays`,
  );
} catch (error) {
  console.error(`fence cleanup failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
} finally {
  await module.close();
}
