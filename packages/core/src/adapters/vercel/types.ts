/**
 * The adapter's public interfaces: the queue (`VercelQueue`), its poll
 * workers and their health, the incidents it reports and the delivery events
 * it emits, and what a route's trigger tells it. Its options and resolved
 * configuration are in config.ts, the trigger blocks in triggers.ts.
 */
import type { BoundConsumer, DeliveryResult, QueuePort, ReplayLanePort } from "../../queue-port.ts";

export interface VercelWorkerOptions {
  /** Lanes, each receiving and running one message at a time. @default 4 */
  readonly concurrency?: number;
  /** Wait after an empty receive before asking again. @default 1_000 */
  readonly idleDelayMs?: number;
  /** Wait after a failed receive (network, 5xx, auth) before asking again. @default 5_000 */
  readonly errorDelayMs?: number;
  /**
   * Lanes receiving the consumer's replay topic (`toVercelReplayTopic`), apart
   * from `concurrency`: replays never take live lanes (SPEC §5). 0 starts
   * none (another worker or a route serves the replay topic). @default 1
   */
  readonly replayConcurrency?: number;
  /**
   * The consumer group's delivery cap, if the service applies one to poll
   * consumers (undocumented; `vercel dev` drops at 32). Must be at least
   * the consumer's `maxAttempts + 2`. @default DEFAULT_MAX_DELIVERIES
   */
  readonly maxDeliveries?: number;
  /** Consecutive auth failures (401, 403, no OIDC token) after which an incident with `alert: true` is raised. @default 3 */
  readonly authAlertAfter?: number;
  /**
   * Consecutive auth failures after which the worker fails: it stops
   * receiving, `health().state` is `failed` and `failed` resolves with the
   * error. Off Vercel an expired OIDC token is refreshed only by a linked
   * Vercel CLI, so retrying forever only hides the outage. @default 20
   */
  readonly maxAuthFailures?: number;
}

/** A poll worker's health, for a liveness probe. */
export interface VercelWorkerHealth {
  /** `degraded`: auth failures past `authAlertAfter`; `failed`: past `maxAuthFailures`, no longer receiving. */
  readonly state: "running" | "degraded" | "failed" | "stopped";
  readonly consecutiveAuthFailures: number;
  /** When a receive last succeeded (ms since the epoch), if ever. */
  readonly lastReceiveAt: number | undefined;
  readonly lastError: string | undefined;
}

export interface VercelWorker {
  /** Lanes busy receiving or delivering right now. */
  readonly inFlight: number;
  health(): VercelWorkerHealth;
  /** Resolves with the reason if the worker fails (auth failures past `maxAuthFailures`); never rejects. */
  readonly failed: Promise<Error>;
  /** Stops receiving and resolves when the deliveries in flight have finished (and been acknowledged or not). */
  stop(): Promise<void>;
}

/** Something went wrong between the adapter and the service that the job's own outcome does not show. */
export interface VercelIncident {
  readonly kind:
    | "ack_failed"
    | "visibility_failed"
    | "lease_renewal_failed"
    | "unconfirmed_callback"
    | "republish_failed"
    | "republish_unconfirmed"
    | "hold_unrecorded"
    | "rescued_before_drop"
    | "dead_lettered_before_drop"
    | "job_at_risk"
    | "auth_failed"
    | "worker_failed";
  readonly queue: string;
  readonly consumer: string;
  readonly messageId?: string;
  readonly message: string;
  /** True when someone should be paged: a job may be lost, or a worker is stalled. */
  readonly alert: boolean;
}

/** What the adapter did with one delivery, for observers (logs, tests). */
export interface VercelDeliveryEvent {
  readonly queue: string;
  readonly consumer: string;
  readonly messageId: string;
  /** The attempt number handed to the harness (deferrals included). */
  readonly deliveryCount: number;
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
  /**
   * `ack`: acknowledged; `visibility`: the lease was moved `afterSeconds` ahead;
   * `deferred`: republished with a delay, then acknowledged; `none`: left to
   * the service's redelivery.
   */
  readonly action: "ack" | "visibility" | "deferred" | "none";
  readonly afterSeconds?: number;
  /** False when the acknowledgement or visibility change failed (the message comes back when its lease ends). */
  readonly applied?: boolean;
}

/** What a route's vercel.json trigger says; the adapter must know it to stay ahead of its cap. */
export interface VercelRouteOptions {
  /** The trigger's `maxDeliveries`: the service drops the message after this many. @default DEFAULT_MAX_DELIVERIES */
  readonly maxDeliveries?: number;
  /** The trigger's `retryAfterSeconds`: the wait after a failed callback. @default 60 */
  readonly retryAfterSeconds?: number;
}

export interface VercelQueue extends QueuePort, ReplayLanePort {
  readonly region: string;
  /** How long the service may hold a message (its retention), for the fence cleanup's `transportHoldMs`. */
  readonly transportHoldMs: number;
  /**
   * A route handler (`export const POST = …`) delivering a vercel.json
   * trigger's messages to `consumer`: those of its queue's topic, and those of
   * its replay topic (`toVercelReplayTopic`) — give the replay topic its own
   * trigger (with its own concurrency) on the same route.
   */
  pushHandler(consumer: BoundConsumer, route?: VercelRouteOptions): (request: Request) => Promise<Response>;
  /** Starts a poll loop delivering `consumer`'s queue (consumer group = its mapped name) until `stop()`. */
  startWorker(consumer: BoundConsumer, options?: VercelWorkerOptions): VercelWorker;
  /** Receives until the queue reports empty, `concurrency` at a time (e.g. from a cron function). Returns the deliveries made. */
  receiveAvailable(
    consumer: BoundConsumer,
    options?: { readonly concurrency?: number; readonly maxDeliveries?: number },
  ): Promise<number>;
  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void;
  /** Incidents so far, by kind (also reported to `onIncident` and the logger). */
  incidentCounts(): Readonly<Record<string, number>>;
  /** Refuses further publishes and stops every worker started here. */
  close(): Promise<void>;
}
