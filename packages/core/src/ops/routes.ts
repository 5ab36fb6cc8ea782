/**
 * Where a replay goes (SPEC §5: a replay is only "done" once it is published
 * to a transport that will deliver it to the letter's consumer).
 *
 * The operator tooling publishes replays through a `ReplayTransport`: the
 * platform's transport, built by a composition root from the environment, and
 * the routes (queue, consumer) it can deliver. For a hosted transport (Vercel
 * Queues) the routes come from a registry that modules contribute to (each
 * module exports its consumers' `ReplayRoute`s); an in-process transport knows
 * by itself which consumers run in this process. A letter no transport can
 * route is refused (`ReplayNotRoutableError`, outcome `not_routable`) and
 * stays `pending_review`.
 */
import { ReplayNotRoutableError } from "../errors.ts";
import type { PublishReceipt, QueuePort, ReplayLanePort } from "../queue-port.ts";

/** One consumer of one queue whose dead letters can be replayed. */
export interface ReplayRoute {
  readonly queue: string;
  readonly consumer: string;
}

export type RouteCheck = { readonly ok: true } | { readonly ok: false; readonly reason: string };

export interface ReplayTransport {
  /** Whether a replay for `consumer` of `queue` reaches that consumer here, and why not. */
  route(queue: string, consumer: string): RouteCheck;
  /**
   * Publishes `body` (the letter's bytes exactly as received) on the
   * consumer's replay lane. Throws `ReplayNotRoutableError` for a route
   * `route()` refuses.
   */
  publishReplay(queue: string, consumer: string, body: string | Uint8Array): Promise<PublishReceipt>;
}

/** The routes a module's consumers contribute: `consumers.map(replayRouteOf)`. */
export function replayRouteOf(consumer: { readonly name: string; readonly queue: string }): ReplayRoute {
  return { queue: consumer.queue, consumer: consumer.name };
}

const key = (queue: string, consumer: string) => `${queue}\u0000${consumer}`;

function guarded(route: ReplayTransport["route"], lanes: ReplayLanePort): ReplayTransport {
  return {
    route,
    async publishReplay(queue, consumer, body) {
      const check = route(queue, consumer);
      if (!check.ok) throw new ReplayNotRoutableError(queue, consumer, check.reason);
      return lanes.publishReplay(queue, body, { targetConsumer: consumer });
    },
  };
}

/**
 * A hosted transport (e.g. Vercel Queues) with the registry of routes the
 * modules contributed: a replay for a route not registered is refused (its
 * replay topic may have no trigger, and nothing would read it).
 */
export function registeredReplay(
  lanes: ReplayLanePort,
  routes: Iterable<ReplayRoute>,
  options: { readonly transport?: string } = {},
): ReplayTransport {
  const known = new Set<string>();
  for (const r of routes) known.add(key(r.queue, r.consumer));
  const transport = options.transport ?? "the configured transport";
  return guarded((queue, consumer) => {
    if (known.has(key(queue, consumer))) return { ok: true };
    return {
      ok: false,
      reason: `no module registered this queue and consumer with ${transport} (a module makes its letters replayable by contributing its consumers' replay routes to the operator tooling's registry)`,
    };
  }, lanes);
}

/** Why an in-process transport refuses a consumer that does not run in this process. */
export const NOT_IN_PROCESS =
  "the only transport here is in-process and that consumer does not run in this process, so nothing would ever read the replay (configure the platform transport, e.g. SOFTCRUM_QUEUE=vercel, or run the module's consumers here)";

/**
 * An in-process transport (the memory adapter): only consumers subscribed in
 * this process read it, so a replay for any other consumer is refused.
 */
export function inProcessReplay(
  lanes: ReplayLanePort & Required<Pick<ReplayLanePort, "hasConsumer">>,
): ReplayTransport {
  return guarded((queue, consumer) => {
    if (lanes.hasConsumer(queue, consumer)) return { ok: true };
    return { ok: false, reason: NOT_IN_PROCESS };
  }, lanes);
}

/** Several transports: a replay goes through the first that routes it. */
export function firstRoutingReplay(
  transports: readonly ReplayTransport[],
  options: { readonly noneReason?: string } = {},
): ReplayTransport {
  const route = (queue: string, consumer: string): RouteCheck => {
    const reasons: string[] = [];
    for (const t of transports) {
      const check = t.route(queue, consumer);
      if (check.ok) return check;
      reasons.push(check.reason);
    }
    return {
      ok: false,
      reason: [...new Set(reasons)].join("; ") || (options.noneReason ?? "no transport is configured"),
    };
  };
  return {
    route,
    async publishReplay(queue, consumer, body) {
      for (const t of transports) if (t.route(queue, consumer).ok) return t.publishReplay(queue, consumer, body);
      const check = route(queue, consumer);
      throw new ReplayNotRoutableError(queue, consumer, check.ok ? "no transport" : check.reason);
    },
  };
}

/**
 * The replay transport of a queue adapter passed as `OpsDeps.queue`: the
 * in-process adapter knows its consumers; any other adapter needs `routes`
 * (the registry); an adapter without a replay lane routes nothing.
 */
export function replayTransportFor(
  queue: QueuePort & Partial<ReplayLanePort>,
  routes: Iterable<ReplayRoute> | undefined,
): ReplayTransport {
  const lanes = typeof queue.publishReplay === "function" ? (queue as QueuePort & ReplayLanePort) : undefined;
  if (!lanes) {
    return guarded(
      () => ({ ok: false, reason: "the queue adapter given to the operations has no replay lane (publishReplay)" }),
      { publishReplay: async () => ({ messageId: null, stored: false }) },
    );
  }
  if (routes) return registeredReplay(lanes, routes);
  if (typeof lanes.hasConsumer === "function") return inProcessReplay(lanes as Parameters<typeof inProcessReplay>[0]);
  return registeredReplay(lanes, []);
}

/**
 * What a module contributes to the operator tooling so that its dead letters
 * can be replayed (the registry is the list of these the tooling's
 * composition root collects): the routes of its consumers, and optionally a
 * way to run those consumers inside the tooling's process for local runs
 * without a hosted queue.
 */
export interface ReplayModule {
  /** For messages: "loyalty". */
  readonly name: string;
  /** Every consumer whose letters may be replayed: `consumers.map(replayRouteOf)`. */
  readonly routes: readonly ReplayRoute[];
  /**
   * Local runs only (no hosted transport configured): starts the module's
   * consumers in this process on an in-process queue and returns its replay
   * lanes. Without it, the module's letters are refused when the only
   * transport is in-process.
   */
  runInProcess?(options: { readonly databaseUrl: string }): Promise<InProcessConsumers>;
}

export interface InProcessConsumers {
  /** The in-process queue its consumers are subscribed to. */
  readonly lanes: ReplayLanePort & Required<Pick<ReplayLanePort, "hasConsumer">>;
  /** Lets the replays published so far run to the end, then stops the consumers. */
  close(): Promise<void>;
}
