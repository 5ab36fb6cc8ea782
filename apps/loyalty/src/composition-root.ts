/**
 * The loyalty module's composition root: the one place that decides which
 * database, queue adapter, alerts and metrics the module runs with.
 * - DATABASE_URL set: real Postgres through postgres.js. It must be migrated
 *   already (`pnpm db:migrate`, a deploy step): a service never migrates at
 *   start, it refuses to start (NotMigratedError) on a database behind its code;
 * - otherwise: an embedded Postgres (PGlite), so the module runs with no
 *   server; it is created empty, so it is migrated here.
 * - SOFTCRUM_QUEUE=vercel (production): Vercel Queues, configured from the
 *   environment Vercel sets (VERCEL_REGION, OIDC, VERCEL_DEPLOYMENT_ID) and
 *   the queue secret you set (SOFTCRUM_QUEUE_SECRET, which signs deferrals); the
 *   consumer is served by a route file (`awardPointsRoute`) or a poll worker.
 *   It needs DATABASE_URL: an embedded database in a serverless function would
 *   lose its fences between invocations.
 * - otherwise: the in-process adapter.
 * Switching transports changes nothing outside this file.
 *
 * The module has two consumers: award-points credits and writes a partner
 * notification to the transactional outbox in the same transaction;
 * notify-partner calls the partner. The outbox relay publishes committed
 * notifications through the same queue adapter: woken right after each
 * credit commits, and polling (`outboxRelay.start()`, the worker does it)
 * for anything a crashed or another process left behind.
 *
 * Its recurring work (recurring.ts) is a third consumer, on its own queue:
 * `recurringTasks` are the fan-out tasks whose jobs it runs, their tenants
 * read from this module's database; the worker schedules them, or a Vercel
 * Cron route per task does (cron-routes.ts).
 */
import {
  type AlertPort,
  type AnyPgDatabase,
  type BoundConsumer,
  bindConsumer,
  type Clock,
  type Consumer,
  type FanOutTask,
  InvalidConfigError,
  type Logger,
  type MetricsPort,
  reportConsumerVersions,
} from "@softcrum/core";
import { createMemoryQueue, type MemoryQueue } from "@softcrum/core/adapters/memory";
import type {
  VercelQueue,
  VercelQueueOptions,
  VercelTrigger,
  VercelWorker,
  VercelWorkerOptions,
} from "@softcrum/core/adapters/vercel";
import { assertMigrated, coreMigrations, migrate, postgresJsSession, queryRowsSession } from "@softcrum/core/migrate";
import { createOutboxRelay, type OutboxRelay } from "@softcrum/core/outbox";
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

const routeOptions = (trigger: VercelTrigger) => ({
  maxDeliveries: trigger.maxDeliveries,
  retryAfterSeconds: trigger.retryAfterSeconds,
});

export type LoyaltyTransport = "memory" | "vercel";

export interface LoyaltyModuleOptions extends AwardPointsOptions, NotifyPartnerOptions {
  /** Postgres URL; `null` forces the embedded PGlite. @default process.env.DATABASE_URL, else PGlite */
  readonly databaseUrl?: string | null | undefined;
  /** Which queue adapter. @default process.env.SOFTCRUM_QUEUE, else "memory" */
  readonly transport?: LoyaltyTransport;
  /** The fence TTL the cleanup uses: the harness refuses copies that could outlive it (`HarnessDeps.fenceTtlMs`). @default none */
  readonly fenceTtlMs?: number;
  /**
   * The build or deployment this process runs, reported for its consumers
   * (a replay batch runs only against the version it was approved for).
   * @default SOFTCRUM_BUILD_ID, else VERCEL_DEPLOYMENT_ID, else "local"
   */
  readonly version?: string;
  /** Vercel Queues settings; unset ones come from the environment. @default {} */
  readonly vercel?: VercelQueueOptions;
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
  const transport = resolveTransport(options.transport);
  const url = options.databaseUrl === undefined ? process.env["DATABASE_URL"] : options.databaseUrl;
  if (transport === "vercel" && !url) {
    throw new InvalidConfigError(
      "SOFTCRUM_QUEUE=vercel needs DATABASE_URL: an embedded database in a serverless function loses its fences",
    );
  }
  // Checked before opening the database, so a missing Vercel setting fails fast.
  const vercel = transport === "vercel" ? await openVercel(options) : undefined;
  const { db, database, closeDb } = url ? await openPostgres(url) : await openPglite();
  const queue =
    vercel ??
    createMemoryQueue({
      ...(options.clock ? { clock: options.clock } : {}),
      concurrency: options.concurrency ?? 4,
    });
  const outboxRelay = createOutboxRelay({ db, queue, ...(options.logger ? { logger: options.logger } : {}) });
  const deps = {
    db,
    ...(options.alerts ? { alerts: options.alerts } : {}),
    ...(options.metrics ? { metrics: options.metrics } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
    ...(options.clock ? { now: () => options.clock?.now() ?? Date.now() } : {}),
    ...(options.fenceTtlMs !== undefined ? { fenceTtlMs: options.fenceTtlMs } : {}),
  };
  const awardConsumer = createAwardPointsConsumer(options);
  const notifyConsumer = createNotifyPartnerConsumer(options);
  // The credit's notification goes out as soon as the credit commits.
  const awardPoints = bindConsumer(awardConsumer, { ...deps, outboxRelay });
  const notifyPartner = bindConsumer(notifyConsumer, deps);
  const recurringConsumer = createRecurringConsumer();
  const recurring = bindConsumer(recurringConsumer, deps);
  const recurringTasks = loyaltyRecurringTasks(db);
  const consumers = [awardConsumer, notifyConsumer, recurringConsumer];
  // What a replay batch is made and approved for (#21 item 6): this build, and the kinds it accepts.
  await reportConsumerVersions(db, consumers, options.version ?? buildVersion()).catch(async (error: unknown) => {
    await closeDb();
    throw error;
  });
  if (vercel) {
    const triggers = loyaltyTriggers({
      awardPoints: awardConsumer,
      notifyPartner: notifyConsumer,
      recurring: recurringConsumer,
    });
    return {
      transport: "vercel",
      db,
      database,
      consumers,
      awardPoints,
      notifyPartner,
      recurring,
      recurringTasks,
      outboxRelay,
      queue: vercel,
      // The adapter must know each route's trigger (its delivery cap) to dead-letter before the service drops.
      awardPointsRoute: vercel.pushHandler(awardPoints, routeOptions(triggers.awardPoints.trigger)),
      notifyPartnerRoute: vercel.pushHandler(notifyPartner, routeOptions(triggers.notifyPartner.trigger)),
      recurringRoute: vercel.pushHandler(recurring, routeOptions(triggers.recurring.trigger)),
      startAwardPointsWorker: (workerOptions) => vercel.startWorker(awardPoints, workerOptions),
      startNotifyPartnerWorker: (workerOptions) => vercel.startWorker(notifyPartner, workerOptions),
      startRecurringWorker: (workerOptions) => vercel.startWorker(recurring, workerOptions),
      async close() {
        await outboxRelay.stop();
        await vercel.close();
        await closeDb();
      },
    };
  }
  const memory = queue as MemoryQueue;
  memory.subscribe(awardPoints);
  memory.subscribe(notifyPartner);
  memory.subscribe(recurring);
  return {
    transport: "memory",
    db,
    database,
    consumers,
    awardPoints,
    notifyPartner,
    recurring,
    recurringTasks,
    outboxRelay,
    queue: memory,
    async settle() {
      for (;;) {
        await memory.drain();
        // Waits for any pass a commit woke, then relays whatever is left.
        const relayed = await outboxRelay.run();
        if (relayed.published === 0 && memory.pending() === 0) return;
      }
    },
    async close() {
      await outboxRelay.stop();
      await memory.close();
      await closeDb();
    },
  };
}

function resolveTransport(explicit: LoyaltyTransport | undefined): LoyaltyTransport {
  const value = explicit ?? process.env["SOFTCRUM_QUEUE"] ?? "memory";
  if (value !== "memory" && value !== "vercel") {
    throw new InvalidConfigError(`SOFTCRUM_QUEUE must be "memory" or "vercel", got ${JSON.stringify(value)}`);
  }
  return value;
}

async function openVercel(options: LoyaltyModuleOptions): Promise<VercelQueue> {
  // Loaded only here, so the in-process setup never needs the Vercel SDK.
  const { createVercelQueue } = await import("@softcrum/core/adapters/vercel");
  return createVercelQueue({
    ...(options.clock ? { clock: options.clock } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
    // Failed acknowledgements, lost leases, rescues and auth failures are counted (softcrum.transport.incident).
    ...(options.metrics ? { metrics: options.metrics } : {}),
    ...options.vercel,
  });
}

/** This process's build: set SOFTCRUM_BUILD_ID (a git sha, a release) where Vercel's deployment id is not set. */
function buildVersion(): string {
  return process.env["SOFTCRUM_BUILD_ID"] || process.env["VERCEL_DEPLOYMENT_ID"] || "local";
}

async function openPostgres(url: string) {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  // The routes' trigger concurrency is sized against this pool (vercel-triggers.ts).
  const client = postgres(url, { max: LOYALTY_POOL_SIZE, onnotice: () => {} });
  // A few catalog reads on the pool: every start (a Vercel cold start too) checks, none migrates.
  try {
    await assertMigrated(postgresJsSession(client), [coreMigrations, loyaltyMigrations]);
  } catch (error) {
    await client.end();
    throw error;
  }
  const db = drizzle({ client });
  return { db: db as AnyPgDatabase, database: "postgres" as const, closeDb: () => client.end() };
}

async function openPglite() {
  const { PGlite } = await import("@electric-sql/pglite");
  const { drizzle } = await import("drizzle-orm/pglite");
  const client = new PGlite();
  // One process owns an embedded database: no lock to take.
  const session = queryRowsSession(client);
  await migrate(session, coreMigrations, { lock: false });
  await migrate(session, loyaltyMigrations, { lock: false });
  const db = drizzle({ client });
  return { db: db as AnyPgDatabase, database: "pglite" as const, closeDb: () => client.close() };
}
