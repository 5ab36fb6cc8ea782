/**
 * The loyalty module's long-running worker: consumes its queue and keeps its
 * tables tidy — the processed_jobs fence cleanup runs on a schedule. Alerts go
 * to BetterStack when BETTERSTACK_SOURCE_TOKEN is set, metrics to the global
 * OpenTelemetry MeterProvider (a no-op unless the process installs an SDK).
 *
 *   DATABASE_URL=postgres://… pnpm --filter @softcrum/example-loyalty worker
 *
 * FENCE_TTL_HOURS (default 168 = 7 days) and FENCE_CLEANUP_EVERY_MINUTES
 * (default 15) tune the cleanup; a TTL shorter than twice a consumer's retry
 * window is refused at start.
 */
import { type CleanupReport, createFenceCleanup, scheduleFenceCleanup } from "@softcrum/core/maintenance";
import { createOtelMetrics } from "@softcrum/core/metrics/opentelemetry";
import { createOps } from "@softcrum/core/ops";
import type { PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule, type LoyaltyModule } from "./composition-root.ts";

export interface WorkerOptions {
  readonly databaseUrl?: string | null;
  readonly notifier: PartnerNotifier;
  readonly fenceTtlMs: number;
  readonly cleanupEveryMs: number;
  readonly onCleanup?: (report: CleanupReport) => void;
}

export interface LoyaltyWorker {
  readonly module: LoyaltyModule;
  stop(): Promise<void>;
}

export async function startLoyaltyWorker(options: WorkerOptions): Promise<LoyaltyWorker> {
  const sourceToken = process.env["BETTERSTACK_SOURCE_TOKEN"];
  const alerts = sourceToken
    ? (await import("@softcrum/core/alerts/betterstack")).createBetterStackAlerts({ sourceToken })
    : undefined;
  let depthReader: (() => ReturnType<ReturnType<typeof createOps>["deadLetters"]["depth"]>) | undefined;
  const metrics = createOtelMetrics({ deadLetterDepth: () => (depthReader ? depthReader() : Promise.resolve([])) });
  const module = await createLoyaltyModule({
    ...(options.databaseUrl !== undefined ? { databaseUrl: options.databaseUrl } : {}),
    notifier: options.notifier,
    metrics,
    ...(alerts ? { alerts } : {}),
  });
  const ops = createOps({ db: module.db, queue: module.queue, metrics });
  depthReader = () => ops.deadLetters.depth();
  // Validated here, at start: a TTL a late retry could outlive stops the worker before it consumes anything.
  const cleanup = createFenceCleanup({ db: module.db, ttlMs: options.fenceTtlMs, consumers: module.consumers });
  const schedule = scheduleFenceCleanup(cleanup, {
    intervalMs: options.cleanupEveryMs,
    onRun: (report) => options.onCleanup?.(report),
    onError: (error) => console.error(`fence cleanup failed (next run retries): ${String(error)}`),
  });
  return {
    module,
    async stop() {
      await schedule.stop();
      metrics.close();
      await module.close();
      await alerts?.close();
    },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const hours = Number(process.env["FENCE_TTL_HOURS"] ?? 168);
  const minutes = Number(process.env["FENCE_CLEANUP_EVERY_MINUTES"] ?? 15);
  const worker = await startLoyaltyWorker({
    notifier: { pointsAwarded: async () => {} },
    fenceTtlMs: hours * 3_600_000,
    cleanupEveryMs: minutes * 60_000,
    onCleanup: (r) => {
      if (r.deleted > 0)
        console.log(`fence cleanup: deleted ${r.deleted} rows in ${r.batches} batches (${r.durationMs} ms)`);
    },
  });
  console.log(
    `loyalty worker running on ${worker.module.database}; fence TTL ${hours} h, cleanup every ${minutes} min`,
  );
  const shutdown = async () => {
    await worker.stop();
    process.exit(0);
  };
  process.once("SIGINT", shutdown);
  process.once("SIGTERM", shutdown);
}
