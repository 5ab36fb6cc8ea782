// `pnpm fences:cleanup [--dry-run [--max-batches N]]`: runs the processed_jobs TTL cleanup once, by hand:
// creates the day partitions ahead, drops the days past the TTL, deletes the expired rows left (ADR 0014).
// DATABASE_URL is required; FENCE_TTL_HOURS (default 192) and SOFTCRUM_QUEUE as for the worker.
// A dry run reads the pages a run would delete from, without deleting; it
// stops after N pages of 5,000 rows (default 200, 1M rows), so on a large
// table it reports a lower bound ("at least") instead of counting every
// expired row.
import { createFenceCleanup } from "@softcrum/core/maintenance";
import { createLoyaltyModule } from "./composition-root.ts";

const usage = "usage: pnpm fences:cleanup [--dry-run [--max-batches N]]";
const args = process.argv.slice(2);
const dryRun = args.includes("--dry-run");
const maxAt = args.indexOf("--max-batches");
const maxBatches = maxAt >= 0 ? Number(args[maxAt + 1]) : 200;
const unknown = args.filter((a, i) => a !== "--dry-run" && !(maxAt >= 0 && (i === maxAt || i === maxAt + 1)));
if (unknown.length > 0 || !Number.isInteger(maxBatches) || maxBatches < 1 || (maxAt >= 0 && !dryRun)) {
  console.error(
    unknown.length > 0
      ? `unknown argument: ${unknown.join(" ")}\n${usage}`
      : `--max-batches takes a whole number >= 1, with --dry-run\n${usage}`,
  );
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
  // Day partitions ahead first, as the worker's schedule does (ADR 0014).
  const ahead = dryRun ? undefined : await cleanup.ensurePartitions?.();
  const report = await cleanup.run(dryRun ? { dryRun, maxBatches } : {});
  const atLeast = report.complete ? "" : "at least ";
  const days = (n: number) => `${n} day partition${n === 1 ? "" : "s"}`;
  console.log(
    dryRun
      ? `dry run: would delete ${atLeast}${report.deleted} fence rows older than ${hours} h; ${report.keptForPendingDeadLetters} expired rows are kept for pending dead letters, ${report.keptForReplays} for recent replays` +
          (report.complete
            ? ""
            : ` (read the first ${report.scanned} expired rows only, in ${report.batches} page${report.batches === 1 ? "" : "s"}: raise --max-batches to read further)`) +
          `; would drop ${days(report.partitionsDropped)} past the TTL, moving ${report.rowsMovedToDefault} kept fences to the default partition`
      : `deleted ${report.deleted} fence rows older than ${hours} h in ${report.batches} batches (${report.durationMs} ms); kept ${report.keptForPendingDeadLetters} for pending dead letters and ${report.keptForReplays} for recent replays; ` +
          `dropped ${days(report.partitionsDropped)} past the TTL (${report.rowsMovedToDefault} kept fences moved to the default partition` +
          (report.partitionsDeferred > 0
            ? `, ${days(report.partitionsDeferred)} left for the next run: a long transaction held the table`
            : "") +
          (report.partitionsKeptForOtherConsumers > 0
            ? `, ${days(report.partitionsKeptForOtherConsumers)} kept: they hold other modules' fences`
            : "") +
          `); created ${days(ahead?.created ?? 0)} ahead`,
  );
} catch (error) {
  console.error(`fence cleanup failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
} finally {
  await module.close();
}
