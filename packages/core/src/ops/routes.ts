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
import type { MemoryQueue, ReplayDelivery } from "../adapters/memory/index.ts";
import { ReplayNotRoutableError } from "../errors.ts";
import type { DeliveryResult, PublishReceipt, QueuePort, ReplayLanePort } from "../queue-port.ts";
import type { StrainMonitor } from "./strain.ts";

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
  /**
   * Only a transport whose consumers run in this process
   * (`inProcessReplay` over a queue that can deliver a replay once): puts
   * `body` on the consumer's replay lane and waits for the consumer's
   * outcome, at most its own bound (`inProcessReplay`'s `timeoutMs`) and
   * `opts.timeoutMs` (pass the caller's own bound). Resolves stored only
   * once that outcome is durable in the database: the job's fence (it ran,
   * or had run: `success`, `duplicate`) or a dead letter written (it failed
   * again). Otherwise — the delivery wrote neither (e.g. the consumer's
   * database role may not write `core.processed_jobs`), or did not settle in
   * time — it throws `ReplayNotAppliedError`, one line saying why, and the
   * transport keeps nothing: no later delivery runs it.
   *
   * The consumer's fence waits while its pending letter is being claimed,
   * so it cannot settle inside the claim's transaction: call it once the
   * claim (`replayed`) has committed, and put the letter back to
   * `pending_review` when it throws (where `mayStillApply`, only if the job
   * has no fence: the delivery may still commit).
   */
  deliverReplay?(
    queue: string,
    consumer: string,
    body: string | Uint8Array,
    opts?: { readonly timeoutMs?: number },
  ): Promise<PublishReceipt>;
}

/** An in-process replay (`ReplayTransport.deliverReplay`) that was not applied, and why, in one line. */
export class ReplayNotAppliedError extends Error {
  constructor(
    message: string,
    /** True when the wait ended with the delivery still running: it may still commit the job's fence. */
    readonly mayStillApply: boolean,
  ) {
    super(message);
    this.name = "ReplayNotAppliedError";
  }
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

/** The longest `deliverReplay` of an in-process transport waits for the consumer's outcome, unless told otherwise. */
export const IN_PROCESS_REPLAY_TIMEOUT_MS = 30_000;

/** The replay lanes of an in-process queue: which consumers run here, and (the memory adapter) a replay delivered once. */
export type InProcessLanes = ReplayLanePort &
  Required<Pick<ReplayLanePort, "hasConsumer">> &
  Partial<Pick<MemoryQueue, "deliverReplayOnce">>;

/**
 * An in-process transport (the memory adapter): only consumers subscribed in
 * this process read it, so a replay for any other consumer is refused. Over
 * a queue that can deliver a replay once, it has `deliverReplay`: the
 * consumer's outcome, waited for at most `timeoutMs` (default
 * `IN_PROCESS_REPLAY_TIMEOUT_MS`).
 */
export function inProcessReplay(lanes: InProcessLanes, options: { readonly timeoutMs?: number } = {}): ReplayTransport {
  const route: ReplayTransport["route"] = (queue, consumer) => {
    if (lanes.hasConsumer(queue, consumer)) return { ok: true };
    return { ok: false, reason: NOT_IN_PROCESS };
  };
  const transport = guarded(route, lanes);
  const deliverOnce = lanes.deliverReplayOnce?.bind(lanes);
  if (deliverOnce === undefined) return transport;
  const ownBound = options.timeoutMs ?? IN_PROCESS_REPLAY_TIMEOUT_MS;
  return {
    ...transport,
    async deliverReplay(queue, consumer, body, opts) {
      const check = route(queue, consumer);
      if (!check.ok) throw new ReplayNotRoutableError(queue, consumer, check.reason);
      const timeoutMs = Math.min(ownBound, opts?.timeoutMs ?? ownBound);
      const delivery = await deliverOnce(queue, body, { targetConsumer: consumer, timeoutMs });
      if (delivery.status === "settled" && appliedOrLettered(delivery.result)) {
        return { messageId: delivery.messageId, stored: true };
      }
      throw notApplied(queue, consumer, delivery, timeoutMs);
    },
  };
}

/** An outcome durable in the database: the job's fence exists, or a dead letter was written. */
function appliedOrLettered(result: DeliveryResult | { readonly outcome: "thrown" }): boolean {
  const { outcome } = result;
  return outcome === "success" || outcome === "duplicate" || outcome === "dead_lettered" || outcome === "poison";
}

function notApplied(queue: string, consumer: string, delivery: ReplayDelivery, timeoutMs: number): Error {
  const replay = `the replay to consumer "${consumer}" of queue "${queue}"`;
  const dropped = "nothing will deliver it again";
  if (delivery.status === "not_started") {
    return new ReplayNotAppliedError(
      `${replay} was not delivered within ${timeoutMs} ms (its replay lane stayed busy, or the queue closed): nothing ran, and ${dropped}`,
      false,
    );
  }
  if (delivery.status === "unsettled") {
    return new ReplayNotAppliedError(
      `${replay} did not settle within ${timeoutMs} ms (or the queue closed first): its delivery was abandoned, may still be running, and ${dropped}`,
      true,
    );
  }
  const { result } = delivery;
  const why = "error" in result ? `: ${oneLine(result.error)}` : ", addressed to another consumer";
  return new ReplayNotAppliedError(
    `${replay} was not applied: its delivery wrote neither its fence nor a dead letter (${result.outcome}${why}), and ${dropped}`,
    false,
  );
}

const oneLine = (text: string) => text.replace(/\s*[\r\n]+\s*/g, " ").trim();

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
  const routing = (queue: string, consumer: string): ReplayTransport => {
    for (const t of transports) if (t.route(queue, consumer).ok) return t;
    const check = route(queue, consumer);
    throw new ReplayNotRoutableError(queue, consumer, check.ok ? "no transport" : check.reason);
  };
  const combined: ReplayTransport = {
    route,
    async publishReplay(queue, consumer, body) {
      return routing(queue, consumer).publishReplay(queue, consumer, body);
    },
  };
  // Waits for the consumer's outcome only when every transport can.
  if (transports.length === 0 || !transports.every((t) => typeof t.deliverReplay === "function")) return combined;
  return {
    ...combined,
    async deliverReplay(queue, consumer, body, opts) {
      const t = routing(queue, consumer);
      return (t.deliverReplay as NonNullable<ReplayTransport["deliverReplay"]>)(queue, consumer, body, opts);
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
  if (typeof lanes.hasConsumer === "function") return inProcessReplay(lanes as InProcessLanes);
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
  readonly lanes: InProcessLanes;
  /** What its consumers report of their strain (a `strainRecorder` given to them as metrics): batches pause on it. */
  readonly strain?: StrainMonitor;
  /** Lets the replays published so far run to the end, then stops the consumers. */
  close(): Promise<void>;
}
