/**
 * The loyalty module's composition root: the one place that decides which
 * database, queue adapter, alerts and metrics the module runs with.
 * - DATABASE_URL set: real Postgres through postgres.js;
 * - otherwise: an embedded Postgres (PGlite), so the module runs with no server.
 * The queue is the in-process adapter.
 */
import {
  type AlertPort,
  type AnyPgDatabase,
  bindConsumer,
  type Clock,
  type Consumer,
  type Logger,
  type MetricsPort,
} from "@softcrum/core";
import { createMemoryQueue, type MemoryQueue } from "@softcrum/core/adapters/memory";
import { coreMigrationsFolder, coreMigrationsTable } from "@softcrum/core/migrate";
import { type AwardPointsOptions, createAwardPointsConsumer } from "./award-points.ts";
import { loyaltyMigrationsFolder, loyaltyMigrationsTable } from "./migrations.ts";

export interface LoyaltyModuleOptions extends AwardPointsOptions {
  /** Postgres URL; `null` forces the embedded PGlite. @default process.env.DATABASE_URL, else PGlite */
  readonly databaseUrl?: string | null | undefined;
  readonly clock?: Clock;
  readonly alerts?: AlertPort;
  readonly metrics?: MetricsPort;
  readonly logger?: Logger;
  /** Deliveries in flight at once. @default 4 */
  readonly concurrency?: number;
}

export interface LoyaltyModule {
  readonly db: AnyPgDatabase;
  readonly queue: MemoryQueue;
  readonly database: "postgres" | "pglite";
  /** The module's consumers: fence cleanup checks its TTL against their retry windows. */
  readonly consumers: readonly Consumer[];
  close(): Promise<void>;
}

export async function createLoyaltyModule(options: LoyaltyModuleOptions): Promise<LoyaltyModule> {
  const url = options.databaseUrl === undefined ? process.env["DATABASE_URL"] : options.databaseUrl;
  const { db, database, closeDb } = url ? await openPostgres(url) : await openPglite();
  const queue = createMemoryQueue({
    ...(options.clock ? { clock: options.clock } : {}),
    concurrency: options.concurrency ?? 4,
  });
  const consumer = createAwardPointsConsumer(options);
  queue.subscribe(
    bindConsumer(consumer, {
      db,
      ...(options.alerts ? { alerts: options.alerts } : {}),
      ...(options.metrics ? { metrics: options.metrics } : {}),
      ...(options.logger ? { logger: options.logger } : {}),
      ...(options.clock ? { now: () => options.clock?.now() ?? Date.now() } : {}),
    }),
  );
  return {
    db,
    queue,
    database,
    consumers: [consumer],
    async close() {
      await queue.close();
      await closeDb();
    },
  };
}

async function openPostgres(url: string) {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const client = postgres(url, { max: 10, onnotice: () => {} });
  const db = drizzle({ client });
  await migrate(db, { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable });
  await migrate(db, { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable });
  return { db: db as AnyPgDatabase, database: "postgres" as const, closeDb: () => client.end() };
}

async function openPglite() {
  const { PGlite } = await import("@electric-sql/pglite");
  const { drizzle } = await import("drizzle-orm/pglite");
  const { migrate } = await import("drizzle-orm/pglite/migrator");
  const client = new PGlite();
  const db = drizzle({ client });
  await migrate(db, { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable });
  await migrate(db, { migrationsFolder: loyaltyMigrationsFolder, ...loyaltyMigrationsTable });
  return { db: db as AnyPgDatabase, database: "pglite" as const, closeDb: () => client.close() };
}
