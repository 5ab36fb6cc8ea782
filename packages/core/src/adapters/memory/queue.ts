/**
 * The queue itself: publishing (live, scheduled, raw and onto a consumer's
 * replay lane, with the idempotency-key window), subscribing, and closing.
 * Routing, the delivery loop and the wake-ups are in their own files.
 */
import { randomUUID } from "node:crypto";
import type { Clock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { InvalidConfigError, QueueClosedError } from "../../errors.ts";
import {
  type BoundConsumer,
  checkDeliveryBound,
  type PublishOptions,
  type PublishReceipt,
  type QueuePort,
  type ReplayLanePort,
} from "../../queue-port.ts";
import { timerDelay } from "../../timers.ts";
import { nonNegative, positive } from "../../validate.ts";
import { DeliveryLoop } from "./delivery.ts";
import { type DeliveryEvent, DeliveryListeners } from "./events.ts";
import type { Message } from "./lanes.ts";
import { type MemoryQueueOptions, type MemoryQueueSettings, resolveOptions } from "./options.ts";
import { Routes } from "./routing.ts";
import { Wakeups } from "./wake.ts";

export interface MemoryQueue extends QueuePort, ReplayLanePort {
  /** Starts delivering the consumer's queue to it. Messages published before anyone subscribed are handed to the first subscriber. */
  subscribe(consumer: BoundConsumer): void;
  /**
   * Puts a body on a queue without validating it — what a producer on another
   * stack or a corrupted message looks like. For tests and demos of poison handling.
   */
  publishRaw(queue: string, body: string | Uint8Array, opts?: PublishOptions): Promise<PublishReceipt>;
  /** Whether `consumer` of `queue` is subscribed here (its replays have a reader). */
  hasConsumer(queue: string, consumer: string): boolean;
  /**
   * A replay whose caller must know what became of it (an operator's
   * in-process replay): puts `body` on the replay lane of `targetConsumer`
   * (subscribed here, else `InvalidConfigError`) like `publishReplay`, and
   * waits, at most `timeoutMs` of real time, for its first delivery to
   * settle. Delivered once, never again: whatever that delivery's result,
   * the message then leaves the queue; at the wait's end (or at `close()`) a
   * message still waiting for a slot is taken off its lane (`not_started`:
   * nothing ran), and one still in flight is abandoned (`unsettled`: its
   * late result changes nothing, and neither `drain()` nor `close()` waits
   * for it; the consumer may still be running it).
   */
  deliverReplayOnce(
    queue: string,
    body: string | Uint8Array,
    opts: { readonly targetConsumer: string; readonly timeoutMs: number },
  ): Promise<ReplayDelivery>;
  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: DeliveryEvent) => void): () => void;
  /**
   * Resolves when every subscribed consumer's messages are acknowledged
   * (messages on queues nobody subscribed to are held, not waited for). With a
   * manual clock it moves the clock forward to each next due message, so a
   * whole retry schedule runs in no real time. A delivery that never settles
   * does not hold it: it is abandoned at its visibility timeout (on a manual
   * clock, after `stuckAfterMs` of real time the clock is moved there).
   */
  drain(): Promise<void>;
  /** Messages not yet acknowledged, per queue and consumer. */
  pending(): number;
  /**
   * Stops delivering and waits for deliveries in flight, at most
   * `closeTimeoutMs`. Publishing afterwards throws `QueueClosedError`.
   */
  close(): Promise<void>;
}

/** What became of a replay delivered once (`deliverReplayOnce`). */
export type ReplayDelivery =
  /** Its delivery settled: the harness's result (or `thrown`). */
  | { readonly status: "settled"; readonly messageId: string; readonly result: DeliveryEvent["result"] }
  /** Not delivered before the wait ended (or the queue closed): taken off its lane, nothing ran. */
  | { readonly status: "not_started"; readonly messageId: string }
  /**
   * Its delivery was still running when the wait ended (or the queue closed,
   * or its visibility timeout passed): abandoned, its outcome unknown.
   */
  | { readonly status: "unsettled"; readonly messageId: string };

class InMemoryQueue implements MemoryQueue {
  readonly #settings: MemoryQueueSettings;
  readonly #clock: Clock;
  readonly #routes = new Routes();
  readonly #dedup = new Map<string, { messageId: string; until: number }>();
  readonly #listeners = new DeliveryListeners();
  readonly #delivery: DeliveryLoop;
  readonly #wake: Wakeups;
  readonly #stopClockListener: (() => void) | undefined;
  /** The waits of `deliverReplayOnce` not over yet: each ends its wait now (close()). */
  readonly #onceWaits = new Set<() => void>();
  #closed = false;

  constructor(options: MemoryQueueOptions) {
    this.#settings = resolveOptions(options);
    this.#clock = this.#settings.clock;
    const isClosed = () => this.#closed;
    this.#delivery = new DeliveryLoop(this.#settings, this.#listeners, isClosed, () => this.#wake.afterChange());
    this.#wake = new Wakeups(
      this.#clock,
      () => this.#routes.all(),
      this.#delivery.inFlight,
      isClosed,
      () => this.#pumpAll(),
    );
    this.#stopClockListener = this.#clock.onAdvance?.(() => this.#pumpAll());
  }

  async publish(queue: string, payload: Envelope, opts?: PublishOptions): Promise<PublishReceipt> {
    // Validate before anything else: an invalid envelope never becomes a message.
    const envelope = parseEnvelope(payload);
    return this.#enqueue(queue, JSON.stringify(envelope), opts);
  }

  async schedule(queue: string, payload: Envelope, runAt: Date): Promise<PublishReceipt> {
    if (!(runAt instanceof Date) || Number.isNaN(runAt.getTime())) {
      throw new InvalidConfigError(`schedule(${JSON.stringify(queue)}): runAt must be a valid Date`);
    }
    return this.publish(queue, payload, { delayMs: Math.max(0, runAt.getTime() - this.#clock.now()) });
  }

  async publishRaw(queue: string, body: string | Uint8Array, opts?: PublishOptions): Promise<PublishReceipt> {
    return this.#enqueue(queue, body, opts);
  }

  async publishReplay(
    queue: string,
    body: string | Uint8Array,
    opts: { readonly targetConsumer: string },
  ): Promise<PublishReceipt> {
    if (typeof opts?.targetConsumer !== "string" || opts.targetConsumer === "") {
      throw new InvalidConfigError("publishReplay needs the targetConsumer whose replay lane it goes to");
    }
    // The bytes as given: a replay republishes the letter's payload exactly as received.
    return this.#enqueue(queue, body, { targetConsumer: opts.targetConsumer, replay: true });
  }

  hasConsumer(queue: string, consumer: string): boolean {
    return this.#routes.has(queue, consumer);
  }

  async deliverReplayOnce(
    queue: string,
    body: string | Uint8Array,
    opts: { readonly targetConsumer: string; readonly timeoutMs: number },
  ): Promise<ReplayDelivery> {
    const target = opts?.targetConsumer;
    if (typeof target !== "string" || target === "") {
      throw new InvalidConfigError("deliverReplayOnce needs the targetConsumer whose replay lane it goes to");
    }
    const timeoutMs = positive(opts.timeoutMs, "timeoutMs");
    if (this.#closed) throw new QueueClosedError();
    // Never held for a later subscriber: the caller waits for a delivery now.
    const lane = this.#routes.route(queue, target, true).lane;
    if (!lane) {
      throw new InvalidConfigError(
        `no consumer "${target}" of "${queue}" is subscribed here: nothing would deliver the replay`,
      );
    }
    let messageId = "";
    let finish: (delivery: ReplayDelivery) => void = () => {};
    const delivered = new Promise<ReplayDelivery>((resolve) => {
      finish = resolve;
    });
    let timer: NodeJS.Timeout | undefined;
    const end = () => {
      clearTimeout(timer);
      this.#onceWaits.delete(endWait);
    };
    // The wait is over before the delivery settled: the message leaves for good.
    const endWait = () => {
      end();
      const message = lane.once(messageId);
      if (!message) return; // it settled meanwhile, and said so
      const started = message.lease !== undefined;
      this.#delivery.abandon(lane, message);
      finish({ status: started ? "unsettled" : "not_started", messageId });
    };
    const onSettled = (result: DeliveryEvent["result"] | "abandoned") => {
      end();
      finish(result === "abandoned" ? { status: "unsettled", messageId } : { status: "settled", messageId, result });
    };
    // Settles in a later microtask at the earliest (deliver is async): the id is known by then.
    messageId = this.#enqueue(queue, body, { targetConsumer: target, replay: true }, onSettled).messageId ?? "";
    this.#onceWaits.add(endWait);
    timer = setTimeout(endWait, timerDelay(timeoutMs));
    return delivered;
  }

  #enqueue(
    queue: string,
    body: string | Uint8Array,
    opts: PublishOptions | undefined,
    onSettled?: Message["onSettled"],
  ): PublishReceipt {
    if (this.#closed) throw new QueueClosedError();
    if (typeof queue !== "string" || queue.length === 0)
      throw new InvalidConfigError("queue must be a non-empty string");
    const delayMs = nonNegative(opts?.delayMs ?? 0, "delayMs");
    const now = this.#clock.now();
    const id = randomUUID();
    const dedupKey = opts?.idempotencyKey === undefined ? undefined : `${queue}\u0000${opts.idempotencyKey}`;
    if (dedupKey !== undefined) {
      const seen = this.#dedup.get(dedupKey);
      if (seen && seen.until > now) return { messageId: seen.messageId, stored: true };
    }
    const target = opts?.targetConsumer;
    const replay = opts?.replay === true;
    const { lane, subscriptions } = this.#routes.route(queue, target, replay);
    // Recorded only once the message is accepted: a publish refused above
    // must not make its corrected retry resolve with a message that never existed.
    if (dedupKey !== undefined) {
      this.#dedup.set(dedupKey, { messageId: id, until: now + this.#settings.dedupWindowMs });
    }
    const copy = (): Message => ({
      id,
      body,
      target,
      replay,
      dueAt: now + delayMs,
      visibleAt: now + delayMs,
      deliveries: 0,
      inFlight: false,
      ...(onSettled ? { onSettled } : {}),
    });
    if (subscriptions.length === 0) {
      this.#routes.hold(queue, copy());
    } else {
      // Each consumer of a queue gets its own copy, like consumer groups.
      for (const subscription of subscriptions) subscription.add(copy(), now);
      if (lane) this.#delivery.pump(lane);
      else this.#pumpQueue(queue);
    }
    return { messageId: id, stored: true };
  }

  subscribe(consumer: BoundConsumer): void {
    if (this.#closed) throw new QueueClosedError();
    if (typeof consumer?.deliver !== "function")
      throw new InvalidConfigError("subscribe() takes a consumer from bindConsumer()");
    const { visibilityTimeoutMs } = this.#settings;
    checkDeliveryBound(consumer, visibilityTimeoutMs, `this queue's visibility timeout (${visibilityTimeoutMs} ms)`);
    const { subscription, replayLane } = this.#routes.add(
      consumer,
      this.#settings.concurrency,
      this.#settings.replayConcurrency,
    );
    this.#delivery.pump(subscription);
    this.#delivery.pump(replayLane);
  }

  onDelivery(listener: (event: DeliveryEvent) => void): () => void {
    return this.#listeners.add(listener);
  }

  pending(): number {
    return this.#routes.pending();
  }

  drain(): Promise<void> {
    return this.#wake.drain();
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#stopClockListener?.();
    this.#wake.cancelTimer();
    const runs = [...this.#delivery.inFlight].flatMap((lease) => (lease.run ? [lease.run] : []));
    if (runs.length > 0) {
      // Bounded: a delivery that never settles must not hold the process open.
      let timer: NodeJS.Timeout | undefined;
      const bound = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, this.#settings.closeTimeoutMs);
      });
      await Promise.race([Promise.allSettled(runs), bound]);
      clearTimeout(timer);
    }
    for (const lease of this.#delivery.inFlight) clearTimeout(lease.stuckTimer);
    // Replays delivered once that nothing will settle now: their callers learn it at once.
    for (const endWait of [...this.#onceWaits]) endWait();
    this.#wake.wakeWaiters();
  }

  #pumpAll(): void {
    for (const s of this.#routes.all()) this.#delivery.pump(s);
  }

  #pumpQueue(queue: string): void {
    for (const s of this.#routes.live(queue)) this.#delivery.pump(s);
  }
}

/** Creates an in-process queue. */
export function createMemoryQueue(options: MemoryQueueOptions = {}): MemoryQueue {
  return new InMemoryQueue(options);
}
