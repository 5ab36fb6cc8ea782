/**
 * The loyalty module's composition root: which database, queue adapter,
 * alerts and metrics the module runs with. `createModule`
 * (`@softcrum/core/module`) does the wiring:
 * - DATABASE_URL set: real Postgres, migrated already (`pnpm db:migrate`, a
 *   deploy step; a database behind the code is refused, NotMigratedError);
 *   otherwise an embedded PGlite, migrated in place (it starts empty);
 * - SOFTCRUM_QUEUE=vercel: Vercel Queues (it needs DATABASE_URL: an embedded
 *   database in a serverless function would lose its fences), each consumer
 *   served by a route file (`awardPointsRoute`, …) bound with its vercel.json
 *   trigger (vercel-triggers.ts), or a poll worker; otherwise in-process.
 * Switching transports changes nothing outside this file.
 *
 * award-points credits and writes a partner notification to the outbox in
 * the same transaction; notify-partner calls the partner; the outbox relay
 * publishes committed notifications through the same queue, woken after each
 * credit commits and polling (`outboxRelay.start()`, the worker does it).
 * The recurring consumer runs the recurring tasks' jobs (recurring.ts), their
 * tenants read from this module's database; the worker or a Vercel Cron route
 * per task schedules them (cron-routes.ts).
 */
import type {
  AlertPort,
  AnyPgDatabase,
  BoundConsumer,
  Clock,
  Consumer,
  FanOutTask,
  Logger,
  MetricsPort,
} from "@softcrum/core";
import type { MemoryQueue } from "@softcrum/core/adapters/memory";
import type {
  VercelQueue,
  VercelQueueOptions,
  VercelWorker,
  VercelWorkerOptions,
} from "@softcrum/core/adapters/vercel";
import { createModule, fromEnv, memory, vercel } from "@softcrum/core/module";
import type { OutboxRelay } from "@softcrum/core/outbox";
import {
  type AwardPointsOptions,
  createAwardPointsConsumer,
  createNotifyPartnerConsumer,
  type NotifyPartnerOptions,
} from "./award-points.ts";
import { loyaltyMigrations } from "./migrations.ts";
import { loyaltyRecurringTasks } from "./recurring.ts";
import { createRecurringConsumer } from "./recurring-jobs.ts";
import { LOYALTY_POOL_SIZE, loyaltyTriggers } from "./vercel-triggers.ts";

export type LoyaltyTransport = "memory" | "vercel";

export interface LoyaltyModuleOptions extends AwardPointsOptions, NotifyPartnerOptions {
  /** Postgres URL; `null` forces the embedded PGlite. @default process.env.DATABASE_URL, else PGlite */
  readonly databaseUrl?: string | null | undefined;
  /** Which queue adapter. @default process.env.SOFTCRUM_QUEUE, else "memory" */
  readonly transport?: LoyaltyTransport;
  /** The fence TTL the cleanup uses: the harness refuses copies that could outlive it (`HarnessDeps.fenceTtlMs`). @default none */
  readonly fenceTtlMs?: number;
  /** The build this process runs, reported for its consumers. @default SOFTCRUM_BUILD_ID, else VERCEL_DEPLOYMENT_ID, else "local" */
  readonly version?: string;
  /** Vercel Queues settings; unset ones come from the environment. @default {} */
  readonly vercel?: VercelQueueOptions;
  /** One clock for the queue and the harness. */
  readonly clock?: Clock;
  readonly alerts?: AlertPort;
  readonly metrics?: MetricsPort;
  readonly logger?: Logger;
  /** Deliveries in flight at once (in-process adapter). @default 4 */
  readonly concurrency?: number;
}

interface LoyaltyModuleBase {
  readonly db: AnyPgDatabase;
  readonly database: "postgres" | "pglite";
  /** The module's consumers: fence cleanup checks its TTL against their retry windows. */
  readonly consumers: readonly Consumer[];
  /** The award-points consumer, bound to the database and ports. */
  readonly awardPoints: BoundConsumer;
  /** The consumer that calls the partner for each committed credit. */
  readonly notifyPartner: BoundConsumer;
  /** The consumer of the recurring jobs (snapshots, freshness, reconciliation, purges, partitions). */
  readonly recurring: BoundConsumer;
  /** The recurring tasks, their tenants read from `db`: for `scheduleFanOut` or `fanOutCronRoute`. */
  readonly recurringTasks: readonly FanOutTask[];
  /** Publishes committed outbox rows through `queue`; `start()` it in a long-running process. */
  readonly outboxRelay: OutboxRelay;
  close(): Promise<void>;
}

export interface InProcessLoyaltyModule extends LoyaltyModuleBase {
  readonly transport: "memory";
  readonly queue: MemoryQueue;
  /** Until the queue and the outbox are both empty: delivers, relays what that committed, delivers that. */
  settle(): Promise<void>;
}

export interface VercelLoyaltyModule extends LoyaltyModuleBase {
  readonly transport: "vercel";
  readonly queue: VercelQueue;
  /** `export const POST = module.awardPointsRoute` in the route file vercel.json triggers. */
  readonly awardPointsRoute: (request: Request) => Promise<Response>;
  /** `export const POST = module.notifyPartnerRoute` in the notifications topic's route file. */
  readonly notifyPartnerRoute: (request: Request) => Promise<Response>;
  /** `export const POST = module.recurringRoute` in the recurring topic's route file. */
  readonly recurringRoute: (request: Request) => Promise<Response>;
  /** For a long-running process instead of push delivery. */
  startAwardPointsWorker(options?: VercelWorkerOptions): VercelWorker;
  startNotifyPartnerWorker(options?: VercelWorkerOptions): VercelWorker;
  startRecurringWorker(options?: VercelWorkerOptions): VercelWorker;
}

export type LoyaltyModule = InProcessLoyaltyModule | VercelLoyaltyModule;

export async function createLoyaltyModule(
  options: LoyaltyModuleOptions & { readonly transport: "memory" },
): Promise<InProcessLoyaltyModule>;
export async function createLoyaltyModule(
  options: LoyaltyModuleOptions & { readonly transport: "vercel" },
): Promise<VercelLoyaltyModule>;
export async function createLoyaltyModule(options: LoyaltyModuleOptions): Promise<LoyaltyModule>;
export async function createLoyaltyModule(options: LoyaltyModuleOptions): Promise<LoyaltyModule> {
  const inProcess = { concurrency: options.concurrency ?? 4 };
  const transport =
    options.transport === "vercel"
      ? vercel(options.vercel)
      : options.transport === "memory"
        ? memory(inProcess)
        : fromEnv({ memory: inProcess, ...(options.vercel ? { vercel: options.vercel } : {}) });
  const award = createAwardPointsConsumer(options);
  const notify = createNotifyPartnerConsumer(options);
  const recurringConsumer = createRecurringConsumer();
  // Each route is bound with its vercel.json trigger: the adapter must know its delivery cap.
  const triggers =
    transport.kind === "vercel"
      ? loyaltyTriggers({ awardPoints: award, notifyPartner: notify, recurring: recurringConsumer })
      : undefined;
  const mod = await createModule({
    name: "loyalty",
    consumers: [award, notify, recurringConsumer],
    migrations: loyaltyMigrations,
    db: options.databaseUrl === null ? "embedded" : options.databaseUrl,
    // The routes' trigger concurrency is sized against this pool (vercel-triggers.ts).
    poolSize: LOYALTY_POOL_SIZE,
    transport,
    outbox: true,
    ...(triggers && {
      routes: {
        [award.name]: triggers.awardPoints,
        [notify.name]: triggers.notifyPartner,
        [recurringConsumer.name]: triggers.recurring,
      },
    }),
    clock: options.clock,
    alerts: options.alerts,
    metrics: options.metrics,
    logger: options.logger,
    fenceTtlMs: options.fenceTtlMs,
    version: options.version,
  });
  const base: LoyaltyModuleBase = {
    db: mod.db,
    database: mod.database,
    consumers: mod.definitions,
    awardPoints: mod.consumer(award.name),
    notifyPartner: mod.consumer(notify.name),
    recurring: mod.consumer(recurringConsumer.name),
    recurringTasks: loyaltyRecurringTasks(mod.db),
    outboxRelay: mod.outboxRelay,
    close: () => mod.close(),
  };
  if (mod.transport === "memory") return { ...base, transport: "memory", queue: mod.queue, settle: () => mod.settle() };
  return {
    ...base,
    transport: "vercel",
    queue: mod.queue,
    awardPointsRoute: mod.route(award.name),
    notifyPartnerRoute: mod.route(notify.name),
    recurringRoute: mod.route(recurringConsumer.name),
    startAwardPointsWorker: (workerOptions) => mod.startWorker(award.name, workerOptions),
    startNotifyPartnerWorker: (workerOptions) => mod.startWorker(notify.name, workerOptions),
    startRecurringWorker: (workerOptions) => mod.startWorker(recurringConsumer.name, workerOptions),
  };
}
