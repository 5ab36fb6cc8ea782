/**
 * vercel.json trigger blocks: the `queue/v2beta` trigger of a consumer's
 * push route, written from its definition (`vercelTrigger`) and checked the
 * way the adapter checks the route when it is bound, and the `functions`
 * block of a module's routes (`vercelFunctionsConfig`).
 */
import { InvalidConfigError } from "../../errors.ts";
import { positiveInteger } from "../../validate.ts";
import { DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DELIVERIES } from "./config.ts";
import { toVercelTopic } from "./topics.ts";

export interface VercelTriggerOptions {
  /** The route file serving the consumer: its key under vercel.json `functions` (e.g. "app/api/queues/award-points/route.ts"). */
  readonly route: string;
  /**
   * Database connections this consumer's deliveries may hold at once, across
   * every invocation (its share of the pool / max_connections). Each delivery
   * holds one at a time (its work transaction, then its dead-letter decision).
   */
  readonly databaseConnections: number;
  /** The trigger's concurrency cap. @default databaseConnections; never above it */
  readonly maxConcurrency?: number;
  /** Wait after a failed callback. @default 60 */
  readonly retryAfterSeconds?: number;
  /** Deliveries before the service drops the message. @default DEFAULT_MAX_DELIVERIES; at least maxAttempts + 2 */
  readonly maxDeliveries?: number;
}

/** One `queue/v2beta` entry of a function's `experimentalTriggers`. */
export interface VercelTrigger {
  readonly type: "queue/v2beta";
  readonly topic: string;
  readonly retryAfterSeconds: number;
  readonly maxDeliveries: number;
  readonly maxConcurrency: number;
}

export interface VercelFunctionsConfig {
  readonly functions: Readonly<Record<string, { readonly experimentalTriggers: readonly [VercelTrigger] }>>;
}

/**
 * The trigger of a consumer's route, from its definition: every option
 * written out (the server's defaults are undocumented; an older trigger
 * version dropped messages after 3 deliveries), and checked the way the
 * adapter checks the route when it is bound (`pushHandler(bound, { maxDeliveries, retryAfterSeconds })`).
 */
export function vercelTrigger(
  consumer: { readonly name: string; readonly queue: string; readonly retryPolicy?: { readonly maxAttempts: number } },
  options: VercelTriggerOptions,
): { readonly route: string; readonly trigger: VercelTrigger } {
  const owner = `vercel trigger of consumer ${JSON.stringify(consumer?.name)}`;
  if (typeof options?.route !== "string" || options.route.trim() === "") {
    throw new InvalidConfigError(`${owner}: route must name the route file serving it`);
  }
  const maxAttempts = consumer.retryPolicy?.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  const maxDeliveries = positiveInteger(options.maxDeliveries ?? DEFAULT_MAX_DELIVERIES, "maxDeliveries");
  if (maxDeliveries < maxAttempts + 2) {
    throw new InvalidConfigError(
      `${owner}: maxDeliveries ${maxDeliveries} is below maxAttempts + 2 (${maxAttempts + 2}); the service would drop jobs before the harness dead-letters them`,
    );
  }
  const connections = positiveInteger(options.databaseConnections, "databaseConnections");
  const maxConcurrency = positiveInteger(options.maxConcurrency ?? connections, "maxConcurrency");
  if (maxConcurrency > connections) {
    throw new InvalidConfigError(
      `${owner}: maxConcurrency ${maxConcurrency} is above its ${connections} database connections; deliveries beyond them would wait for a connection while their leases run`,
    );
  }
  return {
    route: options.route,
    trigger: {
      type: "queue/v2beta",
      topic: toVercelTopic(consumer.queue),
      retryAfterSeconds: positiveInteger(options.retryAfterSeconds ?? 60, "retryAfterSeconds"),
      maxDeliveries,
      maxConcurrency,
    },
  };
}

/** The vercel.json `functions` block of these triggers (one `queue/v2beta` trigger per function, as Vercel allows). */
export function vercelFunctionsConfig(
  triggers: readonly { readonly route: string; readonly trigger: VercelTrigger }[],
): VercelFunctionsConfig {
  const functions: Record<string, { readonly experimentalTriggers: readonly [VercelTrigger] }> = {};
  for (const { route, trigger } of triggers) {
    if (functions[route]) {
      throw new InvalidConfigError(
        `vercel.json: route ${route} has two queue triggers; Vercel allows one per function`,
      );
    }
    functions[route] = { experimentalTriggers: [trigger] };
  }
  return { functions };
}
