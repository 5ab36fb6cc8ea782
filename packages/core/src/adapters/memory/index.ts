/**
 * The in-process QueuePort adapter: for local runs, the embedded demo and
 * tests. It behaves like a real at-least-once transport in the ways that
 * matter to the harness: deliveries run concurrently, a message is removed
 * only when acknowledged, a retry comes back after the delay the harness asks
 * for, an unacknowledged or crashed delivery comes back after a visibility
 * timeout, and each message counts its deliveries. Messages live in memory:
 * nothing survives the process.
 */
import { randomUUID } from "node:crypto";
import { type Clock, systemClock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { describeError, InvalidConfigError, QueueClosedError } from "../../errors.ts";
import type { BoundConsumer, DeliveryResult, PublishOptions, PublishReceipt, QueuePort } from "../../queue-port.ts";
import { nonNegative, positiveInteger } from "../../validate.ts";

export interface MemoryQueueOptions {
  /** @default the system clock; pass `createManualClock()` so backoff takes no real time. */
  readonly clock?: Clock;
  /** Deliveries in flight at once, per subscribed consumer. @default 4 */
  readonly concurrency?: number;
  /** When a delivery neither acks nor asks for a delay (or throws), it comes back after this. @default 30_000 */
  readonly visibilityTimeoutMs?: number;
  /** How long an `idempotencyKey` suppresses another publish with the same key. @default 86_400_000 (24 h, like Vercel Queues) */
  readonly dedupWindowMs?: number;
}

/** One finished delivery, for observers (the demo's summary, tests). */
export interface DeliveryEvent {
  readonly queue: string;
  readonly consumer: string;
  readonly messageId: string;
  readonly deliveryCount: number;
  /** Clock time the delivery started. */
  readonly at: number;
  /** The harness's result, or `thrown` when `deliver` itself threw (treated as a crash: redelivered). */
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
}

export interface MemoryQueue extends QueuePort {
  /** Starts delivering the consumer's queue to it. Messages published before anyone subscribed are handed to the first subscriber. */
  subscribe(consumer: BoundConsumer): void;
  /**
   * Puts a body on a queue without validating it — what a producer on another
   * stack or a corrupted message looks like. For tests and demos of poison handling.
   */
  publishRaw(queue: string, body: string | Uint8Array, opts?: PublishOptions): Promise<PublishReceipt>;
  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: DeliveryEvent) => void): () => void;
  /**
   * Resolves when every subscribed consumer's messages are acknowledged
   * (messages on queues nobody subscribed to are held, not waited for). With a
   * manual clock it moves the clock forward to each next due message, so a
   * whole retry schedule runs in no real time.
   */
  drain(): Promise<void>;
  /** Messages not yet acknowledged, per queue and consumer. */
  pending(): number;
  /** Stops delivering and waits for deliveries in flight. Publishing afterwards throws `QueueClosedError`. */
  close(): Promise<void>;
}

interface Message {
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
}

class Subscription {
  readonly messages: Message[] = [];
  inFlight = 0;
  constructor(readonly consumer: BoundConsumer) {}
}

class InMemoryQueue implements MemoryQueue {
  readonly #clock: Clock;
  readonly #concurrency: number;
  readonly #visibilityTimeoutMs: number;
  readonly #dedupWindowMs: number;
  readonly #subscriptions = new Map<string, Subscription[]>();
  readonly #unrouted = new Map<string, Message[]>();
  readonly #dedup = new Map<string, { messageId: string; until: number }>();
  readonly #listeners = new Set<(event: DeliveryEvent) => void>();
  readonly #idleWaiters = new Set<() => void>();
  readonly #inFlight = new Set<Promise<void>>();
  readonly #stopClockListener: (() => void) | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;

  constructor(options: MemoryQueueOptions) {
    this.#clock = options.clock ?? systemClock;
    this.#concurrency = positiveInteger(options.concurrency ?? 4, "concurrency");
    this.#visibilityTimeoutMs = nonNegative(options.visibilityTimeoutMs ?? 30_000, "visibilityTimeoutMs");
    this.#dedupWindowMs = nonNegative(options.dedupWindowMs ?? 86_400_000, "dedupWindowMs");
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

  #enqueue(queue: string, body: string | Uint8Array, opts: PublishOptions | undefined): PublishReceipt {
    if (this.#closed) throw new QueueClosedError();
    if (typeof queue !== "string" || queue.length === 0)
      throw new InvalidConfigError("queue must be a non-empty string");
    const delayMs = nonNegative(opts?.delayMs ?? 0, "delayMs");
    const now = this.#clock.now();
    const id = randomUUID();
    if (opts?.idempotencyKey !== undefined) {
      const key = `${queue}\u0000${opts.idempotencyKey}`;
      const seen = this.#dedup.get(key);
      if (seen && seen.until > now) return { messageId: seen.messageId };
      this.#dedup.set(key, { messageId: id, until: now + this.#dedupWindowMs });
    }
    const target = opts?.targetConsumer;
    const all = this.#subscriptions.get(queue) ?? [];
    const subscriptions = target === undefined ? all : all.filter((s) => s.consumer.name === target);
    if (target !== undefined && all.length > 0 && subscriptions.length === 0) {
      throw new InvalidConfigError(
        `no consumer "${target}" is subscribed to "${queue}" here; the message would reach no one`,
      );
    }
    const replay = opts?.replay === true;
    const copy = (): Message => ({
      id,
      body,
      target,
      replay,
      dueAt: now + delayMs,
      visibleAt: now + delayMs,
      deliveries: 0,
      inFlight: false,
    });
    if (subscriptions.length === 0) {
      const held = this.#unrouted.get(queue) ?? [];
      held.push(copy());
      this.#unrouted.set(queue, held);
    } else {
      // Each consumer of a queue gets its own copy, like consumer groups.
      for (const subscription of subscriptions) subscription.messages.push(copy());
      this.#pumpQueue(queue);
    }
    return { messageId: id };
  }

  subscribe(consumer: BoundConsumer): void {
    if (this.#closed) throw new QueueClosedError();
    if (typeof consumer?.deliver !== "function")
      throw new InvalidConfigError("subscribe() takes a consumer from bindConsumer()");
    const list = this.#subscriptions.get(consumer.queue) ?? [];
    if (list.some((s) => s.consumer.name === consumer.name)) {
      throw new InvalidConfigError(`consumer "${consumer.name}" is already subscribed to "${consumer.queue}"`);
    }
    const subscription = new Subscription(consumer);
    const held = this.#unrouted.get(consumer.queue);
    if (held) {
      const mine = held.filter((m) => m.target === undefined || m.target === consumer.name);
      subscription.messages.push(...mine);
      const rest = held.filter((m) => !mine.includes(m));
      if (rest.length > 0) this.#unrouted.set(consumer.queue, rest);
      else this.#unrouted.delete(consumer.queue);
    }
    list.push(subscription);
    this.#subscriptions.set(consumer.queue, list);
    this.#pump(subscription);
  }

  onDelivery(listener: (event: DeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  pending(): number {
    let count = 0;
    for (const list of this.#subscriptions.values()) for (const s of list) count += s.messages.length;
    for (const held of this.#unrouted.values()) count += held.length;
    return count;
  }

  async drain(): Promise<void> {
    for (;;) {
      await this.#idle();
      const next = this.#nextVisibleAt();
      if (next === undefined || this.#closed) return;
      const clock = this.#clock as Clock & { advanceTo?: (t: number) => void };
      if (typeof clock.advanceTo === "function") {
        clock.advanceTo(next);
        this.#pumpAll();
      } else {
        await new Promise((resolve) => setTimeout(resolve, Math.max(1, next - this.#clock.now())));
      }
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#stopClockListener?.();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    await Promise.allSettled([...this.#inFlight]);
    for (const resolve of this.#idleWaiters) resolve();
    this.#idleWaiters.clear();
  }

  #pumpAll(): void {
    for (const list of this.#subscriptions.values()) for (const s of list) this.#pump(s);
  }

  #pumpQueue(queue: string): void {
    for (const s of this.#subscriptions.get(queue) ?? []) this.#pump(s);
  }

  #pump(subscription: Subscription): void {
    if (this.#closed) return;
    const now = this.#clock.now();
    for (const message of subscription.messages) {
      if (subscription.inFlight >= this.#concurrency) break;
      if (message.inFlight || message.visibleAt > now) continue;
      this.#start(subscription, message, now);
    }
    this.#afterChange();
  }

  #start(subscription: Subscription, message: Message, now: number): void {
    message.inFlight = true;
    message.deliveries += 1;
    subscription.inFlight += 1;
    const { consumer } = subscription;
    const deliveryCount = message.deliveries;
    const run = (async () => {
      let result: DeliveryEvent["result"];
      try {
        result = await consumer.deliver({
          body: message.body,
          deliveryCount,
          messageId: message.id,
          dueAt: message.dueAt,
          ...(message.target === undefined ? {} : { targetConsumer: message.target }),
          ...(message.replay ? { replay: true } : {}),
        });
      } catch (thrown) {
        result = { outcome: "thrown", error: describeError(thrown) };
      }
      this.#settle(subscription, message, result);
      const event: DeliveryEvent = {
        queue: consumer.queue,
        consumer: consumer.name,
        messageId: message.id,
        deliveryCount,
        at: now,
        result,
      };
      for (const listener of this.#listeners) {
        // An observer's bug must not break deliveries or starve later observers.
        try {
          listener(event);
        } catch {}
      }
    })();
    this.#inFlight.add(run);
    void run.finally(() => {
      this.#inFlight.delete(run);
      this.#pump(subscription);
    });
  }

  #settle(subscription: Subscription, message: Message, result: DeliveryEvent["result"]): void {
    message.inFlight = false;
    subscription.inFlight -= 1;
    if (result.outcome !== "thrown" && result.ack) {
      subscription.messages.splice(subscription.messages.indexOf(message), 1);
      return;
    }
    const now = this.#clock.now();
    if (result.outcome === "retry" || result.outcome === "rate_limited") {
      // A delay the transport cannot honour falls back to the visibility timeout.
      const delay =
        Number.isFinite(result.retryAfterMs) && result.retryAfterMs >= 0
          ? result.retryAfterMs
          : this.#visibilityTimeoutMs;
      message.visibleAt = now + delay;
      // A rate-limit deferral is not an attempt: the next delivery keeps this count.
      if (!result.spendsAttempt) message.deliveries -= 1;
    } else {
      message.visibleAt = now + this.#visibilityTimeoutMs;
    }
  }

  #nextVisibleAt(): number | undefined {
    let next: number | undefined;
    for (const list of this.#subscriptions.values()) {
      for (const s of list) {
        for (const m of s.messages) if (!m.inFlight && (next === undefined || m.visibleAt < next)) next = m.visibleAt;
      }
    }
    return next;
  }

  /** After any change: wake drain() waiters when idle, and (real clock) arm a timer for the next due message. */
  #afterChange(): void {
    const busy = this.#inFlight.size > 0 || this.#hasVisibleWork();
    if (!busy) {
      for (const resolve of this.#idleWaiters) resolve();
      this.#idleWaiters.clear();
    }
    if (this.#clock.onAdvance || this.#closed) return;
    const next = this.#nextVisibleAt();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (next !== undefined && next > this.#clock.now()) {
      this.#timer = setTimeout(() => this.#pumpAll(), next - this.#clock.now());
      this.#timer.unref();
    }
  }

  #hasVisibleWork(): boolean {
    const now = this.#clock.now();
    for (const list of this.#subscriptions.values()) {
      for (const s of list) if (s.messages.some((m) => !m.inFlight && m.visibleAt <= now)) return true;
    }
    return false;
  }

  #idle(): Promise<void> {
    if (this.#inFlight.size === 0 && !this.#hasVisibleWork()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.add(resolve));
  }
}

/** Creates an in-process queue. */
export function createMemoryQueue(options: MemoryQueueOptions = {}): MemoryQueue {
  return new InMemoryQueue(options);
}
