/**
 * `createModule`: a module's composition root in a few lines. It opens the
 * database (database.ts) and the transport (transport.ts), binds every
 * consumer to the same ports, one clock and the outbox relay, reports the
 * consumers' version, and subscribes them (in-process) or makes their push
 * routes (Vercel). What a composition root used to spell out by hand:
 *
 *   const mod = await createModule({
 *     name: "loyalty",
 *     consumers: [awardPoints, notifyPartner],
 *     migrations: loyaltyMigrations,
 *     db: process.env.DATABASE_URL,
 *     transport: fromEnv(),
 *     outbox: true,
 *   });
 */
import { createMemoryQueue, type MemoryQueue } from "../adapters/memory/index.ts";
import type { VercelQueue, VercelRouteOptions, VercelWorker, VercelWorkerOptions } from "../adapters/vercel/types.ts";
import { type Clock, systemClock } from "../clock.ts";
import { bindConsumer, type HarnessDeps } from "../consumer.ts";
import { reportConsumerVersions } from "../db/consumer-versions.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import type { Consumer } from "../definition.ts";
import { InvalidConfigError } from "../errors.ts";
import type { LaneBacklog } from "../lanes/backlog.ts";
import type { RateLimiter } from "../limits/port.ts";
import { createOutboxRelay, type OutboxRelay, type OutboxRelayOptions } from "../outbox/relay.ts";
import type { AlertPort } from "../ports/alerts.ts";
import type { Logger } from "../ports/logger.ts";
import type { MetricsPort } from "../ports/metrics.ts";
import type { BoundConsumer, QueuePort } from "../queue-port.ts";
import { positiveInteger } from "../validate.ts";
import {
  chooseDatabase,
  type DatabaseKind,
  DEFAULT_POOL_SIZE,
  isEmbedded,
  type ModuleDatabaseOption,
  type OpenedDatabase,
  openDatabase,
} from "./database.ts";
import { DuplicateConsumerError, UnknownConsumerError } from "./errors.ts";
import { type ModuleMigrations, migrationSetsOf } from "./migrations.ts";
import {
  checkTransport,
  fromEnv,
  type MemoryTransport,
  oneClock,
  openVercelQueue,
  type Transport,
  type VercelTransport,
} from "./transport.ts";

/** The outbox relay's own settings; the module gives it its database, queue and logger. */
export type OutboxSettings = Omit<OutboxRelayOptions, "db" | "queue">;
/** `true` or settings: one outbox relay on the module's queue, woken by every consumer's commit. */
export type OutboxOption = boolean | OutboxSettings;
/** A push route's options, or a trigger (`vercelTrigger(...)` or its `.trigger`) to take them from. */
export type RouteSetting = VercelRouteOptions | { readonly trigger: VercelRouteOptions };
/** A Next.js App Router route handler: `export const POST = mod.routes["…"]`. */
export type PushRoute = (request: Request) => Promise<Response>;

export interface ModuleOptions<
  T extends Transport = Transport,
  O extends OutboxOption | undefined = OutboxOption | undefined,
> {
  /** The module's name, in errors and migration reports. */
  readonly name: string;
  /** Its consumers (`defineConsumer`); names unique. */
  readonly consumers: readonly Consumer[];
  /** The module's migration sets; the core's are always checked (and applied to an embedded database) first. */
  readonly migrations?: ModuleMigrations;
  /** A Postgres URL, a Drizzle database (the caller closes it), or "embedded". @default env DATABASE_URL, else "embedded" */
  readonly db?: ModuleDatabaseOption;
  /** Connections of the pool opened from a URL. @default 10 */
  readonly poolSize?: number;
  /** Refuse to start on a database behind the migrations (NotMigratedError). @default true */
  readonly checkMigrations?: boolean;
  /** @default fromEnv({ env }) */
  readonly transport?: T;
  /** One clock for the queue and the harness (backoff, delays and ages agree); else the transport's. @default the system clock */
  readonly clock?: Clock;
  readonly alerts?: AlertPort;
  readonly metrics?: MetricsPort;
  readonly logger?: Logger;
  /** The fence TTL the cleanup uses (`HarnessDeps.fenceTtlMs`). @default none */
  readonly fenceTtlMs?: number;
  /** For consumers that declare `limits`. @default none */
  readonly rateLimiter?: RateLimiter;
  /** For consumers of lane queues. @default none */
  readonly laneBacklog?: LaneBacklog;
  /** One outbox relay on the module's queue. @default false */
  readonly outbox?: O;
  /** The build this process runs, reported for its consumers. @default SOFTCRUM_BUILD_ID, else VERCEL_DEPLOYMENT_ID, else "local" */
  readonly version?: string;
  /** Per-consumer push route options (Vercel), by consumer name: from the route's vercel.json trigger. */
  readonly routes?: Readonly<Record<string, RouteSetting>>;
  /** Where DATABASE_URL, SOFTCRUM_QUEUE and the version variables are read. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

interface ModuleBase {
  readonly name: string;
  readonly db: AnyPgDatabase;
  readonly database: DatabaseKind;
  /** The consumers as defined (for `createFenceCleanup`, `checkFenceTtl`). */
  readonly definitions: readonly Consumer[];
  /** Each consumer bound to the database and ports, by name. */
  readonly consumers: Readonly<Record<string, BoundConsumer>>;
  /** The bound consumer of that name; `UnknownConsumerError` if there is none. */
  consumer(name: string): BoundConsumer;
  /** Publishes committed outbox rows through `queue`; `start()` it in a long-running process. */
  readonly outboxRelay: OutboxRelay | undefined;
  /** What was reported for the consumers (`reportConsumerVersions`). */
  readonly version: string;
  /** The clock of the queue and the harness. */
  readonly clock: Clock;
  /** Stops the relay, then the queue, then closes the database if the module opened it. */
  close(): Promise<void>;
}

export interface InProcessModule extends ModuleBase {
  readonly transport: "memory";
  readonly queue: MemoryQueue;
  /** Until the queue and the outbox are both empty: delivers, relays what that committed, delivers that. */
  settle(): Promise<void>;
}

export interface VercelModule extends ModuleBase {
  readonly transport: "vercel";
  readonly queue: VercelQueue;
  /** Each consumer's push route handler, by consumer name. */
  readonly routes: Readonly<Record<string, PushRoute>>;
  /** The push route of that consumer; `UnknownConsumerError` if there is none. */
  route(name: string): PushRoute;
  /** A poll loop for that consumer (a long-running process instead of push delivery). */
  startWorker(name: string, options?: VercelWorkerOptions): VercelWorker;
}

export type Module = InProcessModule | VercelModule;

type RelayOf<O> = [O] extends [false | undefined]
  ? { readonly outboxRelay: undefined }
  : [O] extends [true | OutboxSettings]
    ? { readonly outboxRelay: OutboxRelay }
    : unknown;

/** The module `createModule` makes for a transport choice and outbox option. */
export type ModuleFor<T extends Transport, O> = (T extends MemoryTransport
  ? InProcessModule
  : T extends VercelTransport
    ? VercelModule
    : never) &
  RelayOf<O>;

/** Opens and wires a module; see the file's comment. Closes what it opened if any step fails. */
export async function createModule<T extends Transport = Transport, O extends OutboxOption | undefined = undefined>(
  options: ModuleOptions<T, O>,
): Promise<ModuleFor<T, O>> {
  const name = checkName(options?.name);
  const env = options.env ?? process.env;
  const definitions = checkConsumers(name, options.consumers);
  const names = definitions.map((c) => c.name);
  const routeOptions = checkRoutes(name, names, options.routes);
  const sets = migrationSetsOf(name, options.migrations);
  const transport = checkTransport(name, options.transport ?? fromEnv({ env }));
  const clock = oneClock(name, options.clock, transport);
  const choice = chooseDatabase(name, options.db, env);
  if (transport.kind === "vercel" && isEmbedded(choice)) {
    throw new InvalidConfigError(
      `module ${JSON.stringify(name)}: the vercel transport (SOFTCRUM_QUEUE=vercel) needs DATABASE_URL or db: a real Postgres; an embedded database in a serverless function loses its fences between invocations`,
    );
  }
  const poolSize = positiveInteger(options.poolSize ?? DEFAULT_POOL_SIZE, "poolSize");
  const version = options.version ?? buildVersion(env);
  const ports = { clock, logger: options.logger, metrics: options.metrics };
  // Opened first, so a missing Vercel setting fails before the database is touched.
  const vercelQueue = transport.kind === "vercel" ? await openVercelQueue(transport, ports) : undefined;
  let database: OpenedDatabase;
  try {
    database = await openDatabase(choice, sets, { poolSize, checkMigrations: options.checkMigrations ?? true });
  } catch (error) {
    await vercelQueue?.close().catch(() => {});
    throw error;
  }
  const queue =
    vercelQueue ?? createMemoryQueue({ ...(transport as MemoryTransport).options, ...(clock ? { clock } : {}) });
  try {
    const relay = options.outbox ? openRelay(database.db, queue, options.outbox, options.logger) : undefined;
    const deps: HarnessDeps = {
      db: database.db,
      ...withoutUndefined({
        alerts: options.alerts,
        metrics: options.metrics,
        logger: options.logger,
        fenceTtlMs: options.fenceTtlMs,
        rateLimiter: options.rateLimiter,
        laneBacklog: options.laneBacklog,
        // The harness measures ages and deferrals by the clock the queue times retries by.
        now: clock ? () => clock.now() : undefined,
        // Woken after a commit that wrote to the outbox, so its jobs go out at once.
        outboxRelay: relay,
      }),
    };
    const bound = Object.freeze(Object.fromEntries(definitions.map((c) => [c.name, bindConsumer(c, deps)])));
    const consumer = (wanted: string) => lookup(name, bound, wanted, "consumer()");
    // What a replay batch is made and approved for: this build, and the kinds it accepts.
    await reportConsumerVersions(database.db, definitions, version);
    let closing: Promise<void> | undefined;
    const close = () => {
      closing ??= (async () => {
        try {
          await relay?.stop();
          await queue.close();
        } finally {
          await database.close();
        }
      })();
      return closing;
    };
    const base = {
      name,
      db: database.db,
      database: database.database,
      definitions,
      consumers: bound,
      consumer,
      outboxRelay: relay,
      version,
      clock: clock ?? systemClock,
      close,
    };
    if (vercelQueue) {
      // The adapter must know each route's trigger (its delivery cap) to dead-letter before the service drops.
      const routes = Object.freeze(
        Object.fromEntries(names.map((n) => [n, vercelQueue.pushHandler(consumer(n), routeOptions[n])])),
      );
      const module: VercelModule = {
        ...base,
        transport: "vercel",
        queue: vercelQueue,
        routes,
        route: (wanted) => lookup(name, routes, wanted, "route()"),
        startWorker: (wanted, workerOptions) =>
          vercelQueue.startWorker(lookup(name, bound, wanted, "startWorker()"), workerOptions),
      };
      return module as unknown as ModuleFor<T, O>;
    }
    const memory = queue as MemoryQueue;
    for (const c of Object.values(bound)) memory.subscribe(c);
    const module: InProcessModule = {
      ...base,
      transport: "memory",
      queue: memory,
      async settle() {
        for (;;) {
          await memory.drain();
          // Waits for any pass a commit woke, then relays whatever is left.
          const relayed = relay ? await relay.run() : { published: 0 };
          if (relayed.published === 0 && memory.pending() === 0) return;
        }
      },
    };
    return module as unknown as ModuleFor<T, O>;
  } catch (error) {
    await queue.close().catch(() => {});
    await database.close().catch(() => {});
    throw error;
  }
}

/** This process's build: SOFTCRUM_BUILD_ID (a git sha, a release), else Vercel's deployment id, else "local". */
export function buildVersion(env: Readonly<Record<string, string | undefined>> = process.env): string {
  return env["SOFTCRUM_BUILD_ID"] || env["VERCEL_DEPLOYMENT_ID"] || "local";
}

function openRelay(
  db: AnyPgDatabase,
  queue: QueuePort,
  outbox: Exclude<OutboxOption, false>,
  logger: Logger | undefined,
): OutboxRelay {
  const settings = outbox === true ? {} : outbox;
  return createOutboxRelay({ ...(logger ? { logger } : {}), ...settings, db, queue });
}

function checkName(name: unknown): string {
  if (typeof name !== "string" || name.trim() === "") {
    throw new InvalidConfigError(
      `createModule: name must be a non-blank string (the module's name), got ${typeof name}`,
    );
  }
  return name;
}

function checkConsumers(module: string, consumers: unknown): readonly Consumer[] {
  if (!Array.isArray(consumers)) {
    throw new InvalidConfigError(`module ${JSON.stringify(module)}: consumers must be a list of defineConsumer(...)`);
  }
  const seen = new Set<string>();
  for (const [index, consumer] of consumers.entries()) {
    const c = consumer as Partial<Consumer> | null;
    if (typeof c?.name !== "string" || typeof c.queue !== "string" || typeof c.handle !== "function") {
      throw new InvalidConfigError(
        `module ${JSON.stringify(module)}: consumers[${index}] is not a consumer (make it with defineConsumer)`,
      );
    }
    if (seen.has(c.name)) throw new DuplicateConsumerError(module, c.name);
    seen.add(c.name);
  }
  return Object.freeze([...(consumers as Consumer[])]);
}

function checkRoutes(
  module: string,
  names: readonly string[],
  routes: Readonly<Record<string, RouteSetting>> | undefined,
): Readonly<Record<string, VercelRouteOptions>> {
  const out: Record<string, VercelRouteOptions> = {};
  for (const [key, setting] of Object.entries(routes ?? {})) {
    if (!names.includes(key)) throw new UnknownConsumerError(module, key, names, "routes");
    if (typeof setting !== "object" || setting === null) {
      throw new InvalidConfigError(
        `module ${JSON.stringify(module)}: routes[${JSON.stringify(key)}] must be route options or a trigger`,
      );
    }
    const from = "trigger" in setting ? setting.trigger : setting;
    out[key] = withoutUndefined({ maxDeliveries: from.maxDeliveries, retryAfterSeconds: from.retryAfterSeconds });
  }
  return out;
}

function lookup<V>(module: string, record: Readonly<Record<string, V>>, name: string, where: string): V {
  const value = Object.hasOwn(record, name) ? record[name] : undefined;
  if (value === undefined) throw new UnknownConsumerError(module, String(name), Object.keys(record), where);
  return value;
}

/** The object without its undefined properties (a port not given is left to its default). */
/** `value` without its undefined fields, typed so (exactOptionalPropertyTypes: an optional field is absent, never undefined). */
function withoutUndefined<T extends object>(value: T): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as {
    [K in keyof T]?: Exclude<T[K], undefined>;
  };
}
