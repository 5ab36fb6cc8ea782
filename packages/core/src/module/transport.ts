/**
 * Which queue adapter a module runs on: `memory()` (the in-process adapter),
 * `vercel()` (Vercel Queues), or `fromEnv()` (SOFTCRUM_QUEUE picks one of
 * them). A choice is only a description; `createModule` opens it. The Vercel
 * adapter is imported only when it is opened, so a module on the in-process
 * adapter never loads the Vercel SDK.
 */

import type { MemoryQueueOptions } from "../adapters/memory/options.ts";
import type { VercelQueueOptions } from "../adapters/vercel/config.ts";
import type { VercelQueue } from "../adapters/vercel/types.ts";
import type { Clock } from "../clock.ts";
import { InvalidConfigError } from "../errors.ts";
import type { Logger } from "../ports/logger.ts";
import type { MetricsPort } from "../ports/metrics.ts";

/** The environment variable `fromEnv` reads. */
export const TRANSPORT_ENV = "SOFTCRUM_QUEUE";

/** The in-process adapter (`createMemoryQueue`): local runs, the embedded demo, tests. */
export interface MemoryTransport {
  readonly kind: "memory";
  readonly options: MemoryQueueOptions;
}

/** Vercel Queues (`createVercelQueue`): unset options come from the environment Vercel sets. */
export interface VercelTransport {
  readonly kind: "vercel";
  readonly options: VercelQueueOptions;
}

export type Transport = MemoryTransport | VercelTransport;

/**
 * The in-process adapter. `clock` is the module's clock when the module is
 * given none (one clock for the queue and the harness). @default { concurrency: 4 }
 */
export function memory(options: MemoryQueueOptions = {}): MemoryTransport {
  return Object.freeze({ kind: "memory", options: { ...options } });
}

/** Vercel Queues, with the adapter's options (region, token, wrapperSecret, …; unset ones from the environment). */
export function vercel(options: VercelQueueOptions = {}): VercelTransport {
  return Object.freeze({ kind: "vercel", options: { ...options } });
}

export interface FromEnvOptions {
  /** Where SOFTCRUM_QUEUE is read. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Options of the in-process adapter, when it is the one chosen. */
  readonly memory?: MemoryQueueOptions;
  /** Options of the Vercel adapter, when it is the one chosen. */
  readonly vercel?: VercelQueueOptions;
}

/**
 * The transport SOFTCRUM_QUEUE names: "memory" (also when it is unset or
 * empty) or "vercel". Anything else is an `InvalidConfigError` naming the
 * variable and its value. Switching transports then changes no code.
 */
export function fromEnv(options: FromEnvOptions = {}): Transport {
  const value = (options.env ?? process.env)[TRANSPORT_ENV];
  if (value === undefined || value === "" || value === "memory") return memory(options.memory);
  if (value === "vercel") return vercel(options.vercel);
  throw new InvalidConfigError(
    `${TRANSPORT_ENV} must be "memory" or "vercel" (unset means "memory"), got ${JSON.stringify(value)}`,
  );
}

/** Checks that `transport` is a choice made by `memory`, `vercel` or `fromEnv`. */
export function checkTransport(module: string, transport: unknown): Transport {
  const kind = (transport as { kind?: unknown } | null | undefined)?.kind;
  const options = (transport as { options?: unknown } | null | undefined)?.options;
  if ((kind === "memory" || kind === "vercel") && typeof options === "object" && options !== null) {
    return transport as Transport;
  }
  throw new InvalidConfigError(
    `module ${JSON.stringify(module)}: transport must be memory(), vercel() or fromEnv() from @softcrum/core/module, got ${describe(transport)}`,
  );
}

/**
 * The one clock of a module: the module's `clock`, else the transport's own.
 * Two different clocks are refused: the queue would time retries by one and
 * the harness measure ages by the other.
 */
export function oneClock(module: string, clock: Clock | undefined, transport: Transport): Clock | undefined {
  const own = transport.options.clock;
  if (clock && own && clock !== own) {
    throw new InvalidConfigError(
      `module ${JSON.stringify(module)}: the module's clock and the ${transport.kind} transport's clock differ; pass one clock (the module's \`clock\`), used by the queue and the harness alike`,
    );
  }
  return clock ?? own;
}

/** Opens Vercel Queues, loading the adapter (and the SDK) only now. */
export async function openVercelQueue(
  transport: VercelTransport,
  ports: {
    readonly clock: Clock | undefined;
    readonly logger: Logger | undefined;
    readonly metrics: MetricsPort | undefined;
  },
): Promise<VercelQueue> {
  const { createVercelQueue } = await import("../adapters/vercel/index.ts");
  return createVercelQueue({
    ...(ports.clock ? { clock: ports.clock } : {}),
    ...(ports.logger ? { logger: ports.logger } : {}),
    // Failed acknowledgements, lost leases, rescues and auth failures are counted (softcrum.transport.incident).
    ...(ports.metrics ? { metrics: ports.metrics } : {}),
    ...transport.options,
  });
}

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (value === null || value === undefined) return String(value);
  return typeof value === "object" ? `an object without kind "memory" or "vercel"` : typeof value;
}
