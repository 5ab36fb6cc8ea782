/**
 * What a lane holds: its messages, the deliveries in flight (leases), and the
 * link between a consumer's live lane and its replay lane.
 */
import type { BoundConsumer } from "../../queue-port.ts";
import type { DeliveryEvent } from "./events.ts";

export interface Message {
  readonly id: string;
  readonly body: string | Uint8Array;
  readonly target: string | undefined;
  /** An operator's replay (`PublishOptions.replay`). */
  readonly replay: boolean;
  /** When it first became deliverable (publish time + delay); retries and deferrals do not move it. */
  readonly dueAt: number;
  visibleAt: number;
  /** Deliveries that counted as attempts. */
  deliveries: number;
  inFlight: boolean;
  /** The delivery in flight; undefined once it settled or was abandoned. */
  lease?: Lease | undefined;
  /** Deliveries that ended deferred without spending an attempt (`Delivery.deferrals`); never reset. */
  deferrals?: number;
  /**
   * Set on a message delivered once (`deliverReplayOnce`): called with its
   * first delivery's result (`abandoned`: it did not settle within the
   * visibility timeout, and may still be running), after which the message
   * leaves its lane whatever the result (it is never made visible again).
   */
  readonly onSettled?: ((result: DeliveryEvent["result"] | "abandoned") => void) | undefined;
}

/** One delivery in flight. */
export interface Lease {
  readonly message: Message;
  readonly deliveryCount: number;
  readonly startedAt: number;
  /** Clock time after which the delivery is abandoned and the message handed out again. */
  readonly expiresAt: number;
  run?: Promise<void>;
  /** Manual clock: unsettled after `stuckAfterMs` of real time; `drain()` no longer waits for it. */
  stuck: boolean;
  stuckTimer?: NodeJS.Timeout;
}

export class Subscription {
  readonly messages: Message[] = [];
  readonly leases = new Set<Lease>();
  /** A replay lane's live lane (same consumer): replays wait while live messages wait for a slot. */
  live?: Subscription;
  /** A live lane's replay lane, pumped when a live slot frees. */
  replays?: Subscription;
  constructor(
    readonly consumer: BoundConsumer,
    readonly concurrency: number,
    readonly lane: "live" | "replay",
  ) {}
}

/** A visible message of this lane that no slot has taken yet. */
export function waiting(subscription: Subscription, now: number): boolean {
  return subscription.messages.some((m) => !m.inFlight && m.visibleAt <= now);
}
