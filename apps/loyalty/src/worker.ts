/**
 * The loyalty module's long-running worker: consumes its queue and keeps its
 * tables tidy — the processed_jobs fence cleanup runs on a schedule. Alerts go
 * to BetterStack when BETTERSTACK_SOURCE_TOKEN is set (to the source's ingest
 * host BETTERSTACK_ENDPOINT, when given); stopping sends the alert summaries
 * still pending. Metrics go to the global OpenTelemetry MeterProvider (a no-op
 * unless the process installs an SDK).
 *
 *   DATABASE_URL=postgres://… pnpm --filter @softcrum/example-loyalty worker
 *
 * FENCE_TTL_HOURS (default 192 = 8 days) and FENCE_CLEANUP_EVERY_MINUTES
 * (default 15) tune the cleanup; a TTL shorter than twice a consumer's retry
 * window plus its deferral horizon (12 h by default; plus, on Vercel Queues,
 * the 7 days it may hold a message) is refused at start. With SOFTCRUM_QUEUE=vercel the worker polls the module's topics
 * in the fixed region SOFTCRUM_QUEUE_REGION (not VERCEL_REGION: a message is consumed only in the region it was sent
 * to), unpinned (ADR 0009); its publishes go there unpinned too.
 * It also runs the outbox relay, which publishes the partner notifications
 * the credits committed (several workers may run it at once), and a schedule
 * loop per recurring task (recurring.ts: snapshots, freshness, reconciliation,
 * purges, partitions), each publishing its tick's jobs at the boundary —
 * alongside Vercel Crons of the same tasks or instead of them: both publish
 * the same jobs, applied once.
 * It runs until SIGINT or SIGTERM, then stops gracefully and exits 0 (a
 * second signal exits at once, with 1).
 */

import { type FanOutReport, InvalidConfigError, scheduleFanOut } from "@softcrum/core";
import type { VercelQueueConfig, VercelQueueOptions } from "@softcrum/core/adapters/vercel";
import {
  type CleanupReport,
  checkFenceTtl,
  createFenceCleanup,
  scheduleFenceCleanup,
} from "@softcrum/core/maintenance";
import { createOtelMetrics } from "@softcrum/core/metrics/opentelemetry";
import { cachedDepth, createOps, type Ops } from "@softcrum/core/ops";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { createAwardPointsConsumer, createNotifyPartnerConsumer, type PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule, type LoyaltyModule } from "./composition-root.ts";
import { createRecurringConsumer } from "./recurring-jobs.ts";

/**
 * A poll worker consumes in one fixed region, unpinned: a message is consumed
 * only in the region it was sent to, and a pinned poller strands every other
 * deployment's messages (ADR 0009). Its own publishes follow the same rule.
 * The options are read and checked once, here (`resolveVercelQueueConfig`):
 * the fence check needs their retention before the module exists, and the
 * adapter then takes that configuration as it is (`config`).
 */
async function pollingVercelOptions(
  options: WorkerOptions,
): Promise<VercelQueueOptions & { readonly config: VercelQueueConfig }> {
  const region = options.vercel?.region ?? process.env["SOFTCRUM_QUEUE_REGION"];
  if (!region) {
    throw new InvalidConfigError(
      "SOFTCRUM_QUEUE=vercel: the worker polls Vercel Queues and needs the fixed region its producers send to: set SOFTCRUM_QUEUE_REGION (e.g. iad1), not VERCEL_REGION",
    );
  }
  const polling: VercelQueueOptions = { deploymentId: null, ...options.vercel, region };
  // Loaded only here, so the in-process worker never needs the Vercel SDK.
  const { resolveVercelQueueConfig } = await import("@softcrum/core/adapters/vercel");
  return { ...polling, config: resolveVercelQueueConfig(polling) };
}

export interface WorkerOptions {
  readonly databaseUrl?: string | null;
  readonly notifier: PartnerNotifier;
  /** @default process.env.SOFTCRUM_QUEUE, else "memory" */
  readonly transport?: "memory" | "vercel";
  readonly fenceTtlMs: number;
  readonly cleanupEveryMs: number;
  readonly onCleanup?: (report: CleanupReport) => void;
  /** Vercel Queues settings (with SOFTCRUM_QUEUE=vercel). @default region SOFTCRUM_QUEUE_REGION, unpinned */
  readonly vercel?: VercelQueueOptions;
  /** The recurring tasks' schedule loops; `false` leaves the tasks to Vercel Cron alone. @default every task */
  readonly recurring?:
    | false
    | {
        /** Wall clock of the tick boundaries. @default Date.now */
        readonly now?: () => number;
        /** After each tick a loop fanned out. */
        readonly onRun?: (task: string, report: FanOutReport) => void;
      };
}

export interface LoyaltyWorker {
  readonly module: LoyaltyModule;
  /**
   * Resolves with the reason if a Vercel poll worker fails (auth failures past
   * its limit: an expired OIDC token is renewed only by a linked Vercel CLI);
   * never with the in-process transport.
   */
  readonly failed: Promise<Error>;
  stop(): Promise<void>;
}

export async function startLoyaltyWorker(options: WorkerOptions): Promise<LoyaltyWorker> {
  const transport = options.transport ?? (process.env["SOFTCRUM_QUEUE"] === "vercel" ? "vercel" : "memory");
  const vercelOptions = transport === "vercel" ? await pollingVercelOptions(options) : undefined;
  // The fence TTL must cover the retention the adapter asks for (a message may come back that late):
  // Vercel Queues may hold a message (a deferral, a late redelivery) up to its retention, 7 days by default.
  const transportHoldMs = vercelOptions ? vercelOptions.config.transportHoldMs : 0;
  // Checked first: a TTL a late retry could outlive stops the worker before it opens or consumes anything.
  checkFenceTtl({
    ttlMs: options.fenceTtlMs,
    consumers: [createAwardPointsConsumer(), createNotifyPartnerConsumer(options), createRecurringConsumer()],
    transportHoldMs,
  });

  const sourceToken = process.env["BETTERSTACK_SOURCE_TOKEN"];
  const databaseUrl = options.databaseUrl === undefined ? process.env["DATABASE_URL"] : options.databaseUrl;
  // Alerts coalesce across the whole fleet through core.alert_windows, on a
  // small pool of their own (the module's database is opened after its
  // alerts are bound). The embedded database is one process: no fleet.
  const alertsClient = sourceToken && databaseUrl ? postgres(databaseUrl, { max: 2, onnotice: () => {} }) : undefined;
  const alerts = sourceToken
    ? (await import("@softcrum/core/alerts/betterstack")).createBetterStackAlerts({
        sourceToken,
        ...(process.env["BETTERSTACK_ENDPOINT"] ? { endpoint: process.env["BETTERSTACK_ENDPOINT"] } : {}),
        ...(alertsClient ? { db: drizzle({ client: alertsClient }) } : {}),
      })
    : undefined;
  let depthReader: (() => ReturnType<Ops["deadLetters"]["depth"]>) | undefined;
  const metrics = createOtelMetrics({ deadLetterDepth: () => (depthReader ? depthReader() : Promise.resolve([])) });
  const module = await createLoyaltyModule({
    ...(options.databaseUrl !== undefined ? { databaseUrl: options.databaseUrl } : {}),
    transport,
    ...(vercelOptions ? { vercel: vercelOptions } : {}),
    notifier: options.notifier,
    metrics,
    ...(alerts ? { alerts } : {}),
    // One TTL, obeyed by the cleanup below and by the harness.
    fenceTtlMs: options.fenceTtlMs,
  });
  const ops = createOps({ db: module.db, queue: module.queue, metrics });
  // One depth query per 30 s per process, shared by concurrent collections (#9 item 11).
  depthReader = cachedDepth(() => ops.deadLetters.depth());
  const cleanup = createFenceCleanup({
    db: module.db,
    ttlMs: options.fenceTtlMs,
    consumers: module.consumers,
    transportHoldMs,
  });
  const schedule = scheduleFenceCleanup(cleanup, {
    intervalMs: options.cleanupEveryMs,
    onRun: (report) => options.onCleanup?.(report),
    onError: (error) => console.error(`fence cleanup failed (next run retries): ${String(error)}`),
  });
  // With Vercel Queues this process polls the topic; in-process, the module's
  // queue already delivers what this process publishes.
  const pollers =
    module.transport === "vercel"
      ? [module.startAwardPointsWorker(), module.startNotifyPartnerWorker(), module.startRecurringWorker()]
      : [];
  // Publishes what credits committed: woken after each, polling for what a crashed process left.
  module.outboxRelay.start();
  const loops = options.recurring === false ? [] : startRecurringLoops(module, options.recurring ?? {});
  return {
    module,
    failed: Promise.race(pollers.map((poller) => poller.failed)),
    async stop() {
      // The loops publish: stopped before the transport they publish to.
      await Promise.all(loops.map((loop) => loop.stop()));
      await Promise.all(pollers.map((poller) => poller.stop()));
      await schedule.stop();
      metrics.close();
      await module.close();
      await alerts?.close();
      await alertsClient?.end({ timeout: 5 });
    },
  };
}

/** One `scheduleFanOut` loop per recurring task; a tick some jobs of which were not published is logged to be run again. */
function startRecurringLoops(module: LoyaltyModule, options: Exclude<WorkerOptions["recurring"], false | undefined>) {
  const logger = { warn: (m: string) => console.warn(m), error: (m: string) => console.error(m) };
  return module.recurringTasks.map((task) =>
    scheduleFanOut(task, {
      queue: module.queue,
      logger,
      ...(options.now ? { now: options.now } : {}),
      onRun: (report) => {
        if (report.failed > 0 || report.unconfirmed > 0) {
          console.error(
            `${task.name} ${report.tick}: ${report.failed} failed, ${report.unconfirmed} unconfirmed of ${report.tenants}; run the tick again (runRecurringTick): the published ones are no-ops`,
          );
        }
        options.onRun?.(task.name, report);
      },
    }),
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const hours = Number(process.env["FENCE_TTL_HOURS"] ?? 192);
  const minutes = Number(process.env["FENCE_CLEANUP_EVERY_MINUTES"] ?? 15);
  const worker = await startLoyaltyWorker({
    notifier: { pointsAwarded: async () => {} },
    fenceTtlMs: hours * 3_600_000,
    cleanupEveryMs: minutes * 60_000,
    onCleanup: (r) => {
      if (r.deleted > 0 || r.partitionsDropped > 0)
        console.log(
          `fence cleanup: dropped ${r.partitionsDropped} expired day partitions (${r.rowsMovedToDefault} kept fences moved), ` +
            `deleted ${r.deleted} rows in ${r.batches} batches (${r.durationMs} ms)`,
        );
    },
  });
  console.log(
    `loyalty worker running on ${worker.module.database}; fence TTL ${hours} h, cleanup every ${minutes} min; ${worker.module.recurringTasks.length} recurring tasks scheduled`,
  );
  // The core's timers are unref'd (a library must not hold a process open),
  // and the embedded database holds no socket: without this the process would
  // end as soon as it started. A worker runs until it is told to stop.
  const keepAlive = setInterval(() => {}, 2_147_483_647);
  let stopping = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopping) {
      console.error(`loyalty worker: ${signal} again, exiting without waiting for the graceful stop`);
      process.exit(1);
    }
    stopping = true;
    console.log(`loyalty worker: ${signal}, stopping`);
    worker.stop().then(
      () => {
        clearInterval(keepAlive);
        console.log("loyalty worker: stopped");
        process.exit(0);
      },
      (error: unknown) => {
        console.error(`loyalty worker: stop failed: ${String(error)}`);
        process.exit(1);
      },
    );
  };
  process.on("SIGINT", shutdown);
  process.on("SIGTERM", shutdown);
  // A worker that can no longer receive must not look alive: stop and exit 1, so it is restarted and seen.
  void worker.failed.then((error) => {
    console.error(`loyalty worker: ${error.message}`);
    stopping = true;
    void worker.stop().finally(() => process.exit(1));
  });
}
