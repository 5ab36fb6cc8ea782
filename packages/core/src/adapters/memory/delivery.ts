/**
 * The delivery loop: a lane's visible messages start as deliveries while it
 * has free slots (replays yielding to a live backlog), each delivery holds
 * its message on a lease until it settles or its visibility timeout passes,
 * and its result acknowledges the message or makes it visible again later.
 */
import type { Clock } from "../../clock.ts";
import { describeError } from "../../errors.ts";
import type { DeliveryEvent, DeliveryListeners } from "./events.ts";
import { type Lease, type Message, type Subscription, waiting } from "./lanes.ts";
import type { MemoryQueueSettings } from "./options.ts";

export class DeliveryLoop {
  /** Deliveries in flight, abandoned ones excluded. */
  readonly inFlight = new Set<Lease>();
  readonly #clock: Clock;
  readonly #visibilityTimeoutMs: number;
  readonly #stuckAfterMs: number;
  readonly #listeners: DeliveryListeners;
  readonly #isClosed: () => boolean;
  readonly #afterChange: () => void;

  /**
   * @param isClosed whether the queue was closed: nothing starts any more.
   * @param afterChange called at the end of every pump (wakes drain(), arms the next timer).
   */
  constructor(
    settings: MemoryQueueSettings,
    listeners: DeliveryListeners,
    isClosed: () => boolean,
    afterChange: () => void,
  ) {
    this.#clock = settings.clock;
    this.#visibilityTimeoutMs = settings.visibilityTimeoutMs;
    this.#stuckAfterMs = settings.stuckAfterMs;
    this.#listeners = listeners;
    this.#isClosed = isClosed;
    this.#afterChange = afterChange;
  }

  pump(subscription: Subscription): void {
    if (this.#isClosed()) return;
    const now = this.#clock.now();
    this.#expireLeases(subscription, now);
    // Replays yield to live traffic: none starts while a live message of the
    // same consumer is waiting for a slot (SPEC §5: replays never starve live consumers).
    if (subscription.live && waiting(subscription.live, now)) {
      this.#afterChange();
      return;
    }
    // Visible messages start in lane order; a lane looks at no other message.
    while (subscription.leases.size < subscription.concurrency) {
      const message = subscription.take(now);
      if (message === undefined) break;
      this.#start(subscription, message, now);
    }
    this.#afterChange();
  }

  #start(subscription: Subscription, message: Message, now: number): void {
    message.inFlight = true;
    message.deliveries += 1;
    const lease: Lease = {
      message,
      deliveryCount: message.deliveries,
      startedAt: now,
      expiresAt: now + this.#visibilityTimeoutMs,
      stuck: false,
    };
    message.lease = lease;
    subscription.leases.add(lease);
    this.inFlight.add(lease);
    const { consumer } = subscription;
    const { deliveryCount } = lease;
    const deferrals = message.deferrals ?? 0;
    const run = (async () => {
      let result: DeliveryEvent["result"];
      try {
        result = await consumer.deliver({
          body: message.body,
          deliveryCount,
          messageId: message.id,
          dueAt: message.dueAt,
          ...(message.target === undefined ? {} : { targetConsumer: message.target }),
          ...(deferrals > 0 ? { deferrals } : {}),
          ...(message.replay ? { replay: true } : {}),
        });
      } catch (thrown) {
        result = { outcome: "thrown", error: describeError(thrown) };
      }
      // Abandoned at its visibility timeout: the message was handed out again
      // (or is already gone), so this late result must change nothing.
      if (message.lease !== lease) return;
      this.#release(subscription, lease);
      this.#settle(subscription, message, result);
      this.#emit(subscription, lease, result);
      message.onSettled?.(result);
    })();
    lease.run = run;
    if (this.#clock.onAdvance && !this.#isClosed()) {
      lease.stuckTimer = setTimeout(() => {
        lease.stuck = true;
        this.#afterChange();
      }, this.#stuckAfterMs);
      lease.stuckTimer.unref();
    }
    // The next delivery starts on the next turn of the event loop, not in this
    // one's settling callback: a run of deliveries that do no I/O (a yield, a
    // rate-limit wait) would otherwise chain forever without ever letting
    // timers, sockets or other lanes run.
    void run.finally(() => {
      setImmediate(() => {
        this.pump(subscription);
        if (subscription.replays) this.pump(subscription.replays);
      });
    });
  }

  /** The delivery no longer holds its message or a concurrency slot. */
  #release(subscription: Subscription, lease: Lease): void {
    subscription.leases.delete(lease);
    this.inFlight.delete(lease);
    clearTimeout(lease.stuckTimer);
    lease.message.lease = undefined;
    lease.message.inFlight = false;
  }

  /**
   * Deliveries unsettled past their visibility timeout are treated as
   * crashed: their messages come back now (a message delivered once leaves
   * its lane instead).
   */
  #expireLeases(subscription: Subscription, now: number): void {
    for (const lease of subscription.leases) {
      if (lease.expiresAt > now) continue;
      this.#release(subscription, lease);
      const { message } = lease;
      const once = message.onSettled !== undefined;
      if (once) remove(subscription, message);
      else {
        message.visibleAt = lease.expiresAt;
        subscription.wait(message, now);
      }
      const result = {
        outcome: "thrown",
        error: `the delivery did not settle within the visibility timeout of ${this.#visibilityTimeoutMs} ms; treated as a crash, ${once ? "the message was to be delivered once and is dropped" : "the message is delivered again"}`,
      } as const;
      this.#emit(subscription, lease, result);
      message.onSettled?.("abandoned");
    }
  }

  /**
   * Takes a message off its lane for good: one waiting is never delivered;
   * one in flight is abandoned (its late result changes nothing, and neither
   * `drain()` nor `close()` waits for it). Its slot frees at once.
   */
  abandon(subscription: Subscription, message: Message): void {
    if (message.lease) this.#release(subscription, message.lease);
    remove(subscription, message);
    this.pump(subscription);
  }

  #emit(subscription: Subscription, lease: Lease, result: DeliveryEvent["result"]): void {
    this.#listeners.emit({
      queue: subscription.consumer.queue,
      consumer: subscription.consumer.name,
      messageId: lease.message.id,
      deliveryCount: lease.deliveryCount,
      at: lease.startedAt,
      lane: subscription.lane,
      result,
    });
  }

  #settle(subscription: Subscription, message: Message, result: DeliveryEvent["result"]): void {
    // A message delivered once leaves its lane whatever its first delivery did.
    if ((result.outcome !== "thrown" && result.ack) || message.onSettled !== undefined) {
      remove(subscription, message);
      return;
    }
    const now = this.#clock.now();
    if (
      result.outcome === "retry" ||
      result.outcome === "rate_limited" ||
      result.outcome === "yielded" ||
      result.outcome === "deferred"
    ) {
      // A delay the transport cannot honour falls back to the visibility timeout.
      const delay =
        Number.isFinite(result.retryAfterMs) && result.retryAfterMs >= 0
          ? result.retryAfterMs
          : this.#visibilityTimeoutMs;
      message.visibleAt = now + delay;
      subscription.wait(message, now);
      // A deferral (rate limit, handler never started) is not an attempt: the
      // next delivery keeps this count, and knows one more deferral preceded it.
      if (!result.spendsAttempt) {
        message.deliveries -= 1;
        message.deferrals = (message.deferrals ?? 0) + 1;
      }
    } else {
      message.visibleAt = now + this.#visibilityTimeoutMs;
      subscription.wait(message, now);
    }
  }
}

function remove(subscription: Subscription, message: Message): void {
  subscription.delete(message);
}
