/**
 * The notifications module's composition root: the one place that decides
 * which database, queue adapter, rate limiter, Resend client, alerts and
 * metrics the module runs with.
 * - Postgres at `databaseUrl` (else DATABASE_URL), migrated already
 *   (`pnpm db:migrate`): the module refuses to start on a database behind
 *   its code (NotMigratedError).
 * - `databaseUrl: null`: an embedded Postgres (PGlite), created empty and
 *   migrated here (the core's migrations, then this module's) — for the demo,
 *   which needs no server. Only asked for explicitly: a service missing its
 *   DATABASE_URL still fails to start.
 * - The in-process queue adapter, with both lanes of the `email` channel
 *   subscribed: blast chunks on `notif.email.marketing`, single e-mails on
 *   `notif.email.transactional`.
 * - Resend through its real SDK, with RESEND_API_KEY; the SDK reads its base
 *   URL from RESEND_BASE_URL (tests point it at a fake server on loopback).
 * - One rate limiter for both consumers (`inProcessRateLimiter` unless given
 *   one, e.g. the Upstash limiter for a fleet): Resend's 10 requests a second
 *   are the team's, whichever lane spends them.
 * - One lane backlog (`inProcessLaneBacklog` unless given one, e.g.
 *   `upstashLaneBacklog` for a fleet): producers publish through
 *   `countTransactional`, so every transactional e-mail is counted before the
 *   transport has it, and the blast chunks yield while any is outstanding
 *   (`yieldAbove`, default 0): transactional first (SPEC §7).
 */
import {
  type AlertPort,
  type AnyPgDatabase,
  type BoundConsumer,
  bindConsumer,
  type Clock,
  type Consumer,
  countTransactional,
  type Envelope,
  InvalidConfigError,
  inProcessLaneBacklog,
  inProcessRateLimiter,
  type LaneBacklog,
  type Logger,
  type MetricsPort,
  type QueuePort,
  type RateLimiter,
  type RetryPolicy,
  systemClock,
} from "@softcrum/core";
import { createMemoryQueue, type MemoryQueue } from "@softcrum/core/adapters/memory";
import { assertMigrated, coreMigrations, migrate, postgresJsSession, queryRowsSession } from "@softcrum/core/migrate";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { Resend } from "resend";
import { uuidv7 } from "uuidv7";
import { type BlastReport, type StartBlastInput, type StartBlastOptions, startBlast } from "./blast.ts";
import { createBlastChunkConsumer } from "./blast-chunk.ts";
import type { EmailLimitOptions } from "./email-lanes.ts";
import { notificationsMigrations } from "./migrations.ts";
import {
  createTransactionalEmailConsumer,
  type SendTransactionalEmailInput,
  sendTransactionalEmail,
} from "./transactional-email.ts";

export interface NotificationsModuleOptions extends EmailLimitOptions {
  /** Postgres URL; `null` for an embedded PGlite, migrated at start. @default process.env.DATABASE_URL */
  readonly databaseUrl?: string | null;
  /** @default process.env.RESEND_API_KEY */
  readonly resendApiKey?: string;
  /** Where the SDK sends its requests. @default process.env.RESEND_BASE_URL, else Resend's API */
  readonly resendBaseUrl?: string;
  /** @default the system clock; tests pass `createManualClock()` so backoff and rate limits take no real time. */
  readonly clock?: Clock;
  /** @default inProcessRateLimiter on `clock` */
  readonly rateLimiter?: RateLimiter;
  /** The `email` channel's transactional backlog. @default inProcessLaneBacklog on `clock` */
  readonly laneBacklog?: LaneBacklog;
  /** Blast chunks wait while more transactional e-mails than this are outstanding. @default 0 */
  readonly yieldAbove?: number;
  /** Deliveries in flight at once, per consumer. @default 4 */
  readonly concurrency?: number;
  /** Connections in the pool: a chunk holds one while Resend answers. @default 10 */
  readonly poolSize?: number;
  /** Only tests override it; production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
  readonly alerts?: AlertPort;
  readonly metrics?: MetricsPort;
  readonly logger?: Logger;
}

export interface NotificationsModule {
  readonly db: AnyPgDatabase;
  readonly database: "postgres" | "pglite";
  /** The in-process adapter both consumers are subscribed to. */
  readonly queue: MemoryQueue;
  /** What producers publish through: the queue, counting transactional jobs into the lane backlog first. */
  readonly publisher: QueuePort;
  /** The module's consumers: fence cleanup checks its TTL against their retry windows. */
  readonly consumers: readonly Consumer[];
  readonly blastChunk: BoundConsumer;
  readonly transactionalEmail: BoundConsumer;
  /** Starts (or starts again) a blast: see blast.ts. */
  startBlast(input: StartBlastInput, options?: StartBlastOptions): Promise<BlastReport>;
  /** Puts one e-mail on the transactional lane. */
  sendTransactionalEmail(input: SendTransactionalEmailInput): Promise<Envelope>;
  /** Until every published job reached a final outcome (retries and deferrals included). */
  settle(): Promise<void>;
  close(): Promise<void>;
}

/** A new blast id (a UUID v7): keep it with whatever asked for the blast, so asking again starts the same one. */
export function newBlastId(): string {
  return uuidv7();
}

export async function createNotificationsModule(
  options: NotificationsModuleOptions = {},
): Promise<NotificationsModule> {
  const url = options.databaseUrl === undefined ? process.env["DATABASE_URL"] : options.databaseUrl;
  if (url !== null && !url) throw new InvalidConfigError("the notifications module needs Postgres: set DATABASE_URL");
  const apiKey = options.resendApiKey ?? process.env["RESEND_API_KEY"];
  if (!apiKey) throw new InvalidConfigError("the notifications module needs RESEND_API_KEY");
  const resend = new Resend(apiKey, options.resendBaseUrl ? { baseUrl: options.resendBaseUrl } : undefined);
  const clock = options.clock ?? systemClock;
  const now = () => clock.now();

  const { db, database, closeDb } = url === null ? await openPglite() : await openPostgres(url, options.poolSize ?? 10);
  const queue = createMemoryQueue({ clock, concurrency: options.concurrency ?? 4 });
  const laneBacklog = options.laneBacklog ?? inProcessLaneBacklog({ now });
  const publisher = countTransactional(queue, laneBacklog, {
    now,
    ...(options.logger ? { logger: options.logger } : {}),
  });
  const deps = {
    db,
    rateLimiter: options.rateLimiter ?? inProcessRateLimiter({ now }),
    laneBacklog,
    now,
    ...(options.alerts ? { alerts: options.alerts } : {}),
    ...(options.metrics ? { metrics: options.metrics } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
  };
  const limits = {
    ...(options.resendRate ? { resendRate: options.resendRate } : {}),
    ...(options.tenantRate ? { tenantRate: options.tenantRate } : {}),
    ...(options.retry ? { retry: options.retry } : {}),
  };
  const chunkConsumer = createBlastChunkConsumer({
    resend,
    ...limits,
    ...(options.yieldAbove !== undefined ? { yieldAbove: options.yieldAbove } : {}),
  });
  const emailConsumer = createTransactionalEmailConsumer({ resend, ...limits });
  const blastChunk = bindConsumer(chunkConsumer, deps);
  const transactionalEmail = bindConsumer(emailConsumer, deps);
  queue.subscribe(blastChunk);
  queue.subscribe(transactionalEmail);
  return {
    db,
    database,
    queue,
    publisher,
    consumers: [chunkConsumer, emailConsumer],
    blastChunk,
    transactionalEmail,
    startBlast: (input, startOptions) => startBlast({ db, queue: publisher }, input, startOptions),
    sendTransactionalEmail: (input) => sendTransactionalEmail(publisher, input),
    settle: () => queue.drain(),
    async close() {
      await queue.close();
      await closeDb();
    },
  };
}

async function openPostgres(url: string, poolSize: number) {
  const client = postgres(url, { max: poolSize, onnotice: () => {} });
  try {
    await assertMigrated(postgresJsSession(client), [coreMigrations, notificationsMigrations]);
  } catch (error) {
    await client.end();
    throw error;
  }
  return {
    db: drizzle({ client }) as AnyPgDatabase,
    database: "postgres" as const,
    closeDb: () => client.end({ timeout: 5 }),
  };
}

async function openPglite() {
  // Loaded only here: a service on Postgres never loads the embedded database.
  const { PGlite } = await import("@electric-sql/pglite");
  const { drizzle: drizzlePglite } = await import("drizzle-orm/pglite");
  const client = new PGlite();
  try {
    // One process owns an embedded database: no migration lock to take.
    const session = queryRowsSession(client);
    await migrate(session, coreMigrations, { lock: false });
    await migrate(session, notificationsMigrations, { lock: false });
  } catch (error) {
    await client.close();
    throw error;
  }
  return {
    db: drizzlePglite({ client }) as AnyPgDatabase,
    database: "pglite" as const,
    closeDb: () => client.close(),
  };
}
