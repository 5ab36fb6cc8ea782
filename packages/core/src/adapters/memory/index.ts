/**
 * The in-process QueuePort adapter: for local runs, the embedded demo and
 * tests. It behaves like a real at-least-once transport in the ways that
 * matter to the harness: deliveries run concurrently, a message is removed
 * only when acknowledged, a retry comes back after the delay the harness asks
 * for, an unacknowledged or crashed delivery comes back after a visibility
 * timeout, and each message counts its deliveries. A delivery that never
 * settles is treated like a crash once its visibility timeout passes: the
 * message is delivered again, and neither `drain()` nor `close()` waits for
 * the abandoned delivery. Messages live in memory: nothing survives the process.
 */
import { randomUUID } from "node:crypto";
import { type Clock, systemClock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { describeError, InvalidConfigError, QueueClosedError } from "../../errors.ts";
import {
  type BoundConsumer,
  checkDeliveryBound,
  type DeliveryResult,
  type PublishOptions,
  type PublishReceipt,
  type QueuePort,
  type ReplayLanePort,
} from "../../queue-port.ts";
import { timerDelay } from "../../timers.ts";
import { nonNegative, positive, positiveInteger } from "../../validate.ts";

export interface MemoryQueueOptions {
  /** @default the system clock; pass `createManualClock()` so backoff takes no real time. */
  readonly clock?: Clock;
  /** Deliveries in flight at once, per subscribed consumer. @default 4 */
  readonly concurrency?: number;
  /**
   * Replays in flight at once, per subscribed consumer, on its replay lane
   * (`publishReplay`), apart from `concurrency`: a bulk replay never takes
   * the slots live messages use (SPEC §5). @default 1
   */
  readonly replayConcurrency?: number;
  /**
   * When a delivery neither acks nor asks for a delay (or throws), it comes
   * back after this. A delivery still unsettled this long after it started
   * is treated like a crash: the message comes back at once (its delivery
   * count one higher), and a late result of the abandoned delivery is
   * ignored. A consumer's whole delivery (`deliveryBoundMs`: 2 × timeoutMs + 5 s)
   * must be below it. Clock time. @default 60_000 (above the 55 s of a consumer's default 25 s timeoutMs)
   */
  readonly visibilityTimeoutMs?: number;
  /**
   * Longest `close()` waits for deliveries in flight before it returns
   * without them. Real time. @default 60_000
   */
  readonly closeTimeoutMs?: number;
  /**
   * Manual clock only (it moves only when told, so a visibility timeout never
   * passes by itself): a delivery still unsettled after this much real time
   * counts as stuck, and `drain()` moves the clock on (to its visibility
   * timeout, which redelivers it) instead of waiting for it. @default 10_000
   */
  readonly stuckAfterMs?: number;
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
  /** `replay`: from the consumer's replay lane (`publishReplay`); `live`: everything else. */
  readonly lane: "live" | "replay";
  /**
   * The harness's result, or `thrown` when `deliver` itself threw or did not
   * settle within the visibility timeout (treated as a crash: redelivered).
   * An abandoned delivery that settles later reports nothing more.
   */
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
}

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
  /** The delivery in flight; undefined once it settled or was abandoned. */
  lease?: Lease | undefined;
  /** Deliveries that ended deferred without spending an attempt (`Delivery.deferrals`); never reset. */
  deferrals?: number;
}

/** One delivery in flight. */
interface Lease {
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

class Subscription {
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

const laneKey = (queue: string, consumer: string) => `${queue}\u0000${consumer}`;

class InMemoryQueue implements MemoryQueue {
  readonly #clock: Clock;
  readonly #concurrency: number;
  readonly #replayConcurrency: number;
  readonly #visibilityTimeoutMs: number;
  readonly #closeTimeoutMs: number;
  readonly #stuckAfterMs: number;
  readonly #dedupWindowMs: number;
  readonly #subscriptions = new Map<string, Subscription[]>();
  /** Each subscribed consumer's replay lane, by queue and consumer. */
  readonly #replayLanes = new Map<string, Subscription>();
  readonly #unrouted = new Map<string, Message[]>();
  readonly #dedup = new Map<string, { messageId: string; until: number }>();
  readonly #listeners = new Set<(event: DeliveryEvent) => void>();
  readonly #idleWaiters = new Set<() => void>();
  /** Deliveries in flight, abandoned ones excluded. */
  readonly #inFlight = new Set<Lease>();
  readonly #stopClockListener: (() => void) | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;

  constructor(options: MemoryQueueOptions) {
    this.#clock = options.clock ?? systemClock;
    this.#concurrency = positiveInteger(options.concurrency ?? 4, "concurrency");
    this.#replayConcurrency = positiveInteger(options.replayConcurrency ?? 1, "replayConcurrency");
    this.#visibilityTimeoutMs = positive(options.visibilityTimeoutMs ?? 60_000, "visibilityTimeoutMs");
    this.#closeTimeoutMs = nonNegative(options.closeTimeoutMs ?? 30_000, "closeTimeoutMs");
    this.#stuckAfterMs = nonNegative(options.stuckAfterMs ?? 10_000, "stuckAfterMs");
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
    return this.#replayLanes.has(laneKey(queue, consumer));
  }

  /** Every subscription: the live ones and the replay lanes. */
  *#lanes(): Generator<Subscription> {
    for (const list of this.#subscriptions.values()) yield* list;
    yield* this.#replayLanes.values();
  }

  #enqueue(queue: string, body: string | Uint8Array, opts: PublishOptions | undefined): PublishReceipt {
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
    // A replay addressed to one consumer goes to that consumer's replay lane.
    const lane = replay && target !== undefined ? this.#replayLanes.get(laneKey(queue, target)) : undefined;
    const all = this.#subscriptions.get(queue) ?? [];
    const subscriptions = lane ? [lane] : target === undefined ? all : all.filter((s) => s.consumer.name === target);
    if (target !== undefined && all.length > 0 && subscriptions.length === 0) {
      throw new InvalidConfigError(
        `no consumer "${target}" is subscribed to "${queue}" here; the message would reach no one`,
      );
    }
    // Recorded only once the message is accepted: a publish refused above
    // must not make its corrected retry resolve with a message that never existed.
    if (dedupKey !== undefined) this.#dedup.set(dedupKey, { messageId: id, until: now + this.#dedupWindowMs });
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
      if (lane) this.#pump(lane);
      else this.#pumpQueue(queue);
    }
    return { messageId: id, stored: true };
  }

  subscribe(consumer: BoundConsumer): void {
    if (this.#closed) throw new QueueClosedError();
    if (typeof consumer?.deliver !== "function")
      throw new InvalidConfigError("subscribe() takes a consumer from bindConsumer()");
    checkDeliveryBound(
      consumer,
      this.#visibilityTimeoutMs,
      `this queue's visibility timeout (${this.#visibilityTimeoutMs} ms)`,
    );
    const list = this.#subscriptions.get(consumer.queue) ?? [];
    if (list.some((s) => s.consumer.name === consumer.name)) {
      throw new InvalidConfigError(`consumer "${consumer.name}" is already subscribed to "${consumer.queue}"`);
    }
    const subscription = new Subscription(consumer, this.#concurrency, "live");
    const replayLane = new Subscription(consumer, this.#replayConcurrency, "replay");
    subscription.replays = replayLane;
    replayLane.live = subscription;
    const held = this.#unrouted.get(consumer.queue);
    if (held) {
      const mine = held.filter((m) => m.target === undefined || m.target === consumer.name);
      for (const m of mine) (m.replay && m.target !== undefined ? replayLane : subscription).messages.push(m);
      const rest = held.filter((m) => !mine.includes(m));
      if (rest.length > 0) this.#unrouted.set(consumer.queue, rest);
      else this.#unrouted.delete(consumer.queue);
    }
    list.push(subscription);
    this.#subscriptions.set(consumer.queue, list);
    this.#replayLanes.set(laneKey(consumer.queue, consumer.name), replayLane);
    this.#pump(subscription);
    this.#pump(replayLane);
  }

  onDelivery(listener: (event: DeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  pending(): number {
    let count = 0;
    for (const s of this.#lanes()) count += s.messages.length;
    for (const held of this.#unrouted.values()) count += held.length;
    return count;
  }

  async drain(): Promise<void> {
    // The delivery timers are unref'd (a queue alone must not keep a process
    // alive), so while someone awaits drain() this holds the process open:
    // otherwise it could exit (code 13) while a retry waits to come due.
    const keepAlive = setInterval(() => {}, 60_000);
    try {
      for (;;) {
        await this.#idle();
        // Closed: nothing is delivered any more, so nothing would wake us again.
        if (this.#closed) return;
        // Deliveries settle in microtasks: one that settled just before the
        // wait may pump (start the next delivery) only after the wait ended.
        // Were `next` taken then, it would be that delivery's lease expiry,
        // and drain() would sleep the whole visibility timeout (or, on a
        // manual clock, jump there and abandon a delivery still running).
        if (this.#busy()) continue;
        const next = this.#nextWakeAt();
        if (next === undefined) return;
        const clock = this.#clock as Clock & { advanceTo?: (t: number) => void };
        if (typeof clock.advanceTo === "function") {
          clock.advanceTo(next);
          this.#pumpAll();
        } else {
          // Clamped to the timer limit; the loop re-reads the next due time.
          await new Promise((resolve) => setTimeout(resolve, Math.max(1, timerDelay(next - this.#clock.now()))));
        }
      }
    } finally {
      clearInterval(keepAlive);
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#stopClockListener?.();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    const runs = [...this.#inFlight].flatMap((lease) => (lease.run ? [lease.run] : []));
    if (runs.length > 0) {
      // Bounded: a delivery that never settles must not hold the process open.
      let timer: NodeJS.Timeout | undefined;
      const bound = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, this.#closeTimeoutMs);
      });
      await Promise.race([Promise.allSettled(runs), bound]);
      clearTimeout(timer);
    }
    for (const lease of this.#inFlight) clearTimeout(lease.stuckTimer);
    for (const resolve of this.#idleWaiters) resolve();
    this.#idleWaiters.clear();
  }

  #pumpAll(): void {
    for (const s of this.#lanes()) this.#pump(s);
  }

  #pumpQueue(queue: string): void {
    for (const s of this.#subscriptions.get(queue) ?? []) this.#pump(s);
  }

  #pump(subscription: Subscription): void {
    if (this.#closed) return;
    const now = this.#clock.now();
    this.#expireLeases(subscription, now);
    // Replays yield to live traffic: none starts while a live message of the
    // same consumer is waiting for a slot (SPEC §5: replays never starve live consumers).
    if (subscription.live && this.#waiting(subscription.live, now)) {
      this.#afterChange();
      return;
    }
    for (const message of subscription.messages) {
      if (subscription.leases.size >= subscription.concurrency) break;
      if (message.inFlight || message.visibleAt > now) continue;
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
    this.#inFlight.add(lease);
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
    })();
    lease.run = run;
    if (this.#clock.onAdvance && !this.#closed) {
      lease.stuckTimer = setTimeout(() => {
        lease.stuck = true;
        this.#afterChange();
      }, this.#stuckAfterMs);
      lease.stuckTimer.unref();
    }
    void run.finally(() => {
      this.#pump(subscription);
      if (subscription.replays) this.#pump(subscription.replays);
    });
  }

  /** A visible message of this lane that no slot has taken yet. */
  #waiting(subscription: Subscription, now: number): boolean {
    return subscription.messages.some((m) => !m.inFlight && m.visibleAt <= now);
  }

  /** The delivery no longer holds its message or a concurrency slot. */
  #release(subscription: Subscription, lease: Lease): void {
    subscription.leases.delete(lease);
    this.#inFlight.delete(lease);
    clearTimeout(lease.stuckTimer);
    lease.message.lease = undefined;
    lease.message.inFlight = false;
  }

  /** Deliveries unsettled past their visibility timeout are treated as crashed: their messages come back now. */
  #expireLeases(subscription: Subscription, now: number): void {
    for (const lease of subscription.leases) {
      if (lease.expiresAt > now) continue;
      this.#release(subscription, lease);
      lease.message.visibleAt = lease.expiresAt;
      this.#emit(subscription, lease, {
        outcome: "thrown",
        error: `the delivery did not settle within the visibility timeout of ${this.#visibilityTimeoutMs} ms; treated as a crash, the message is delivered again`,
      });
    }
  }

  #emit(subscription: Subscription, lease: Lease, result: DeliveryEvent["result"]): void {
    const event: DeliveryEvent = {
      queue: subscription.consumer.queue,
      consumer: subscription.consumer.name,
      messageId: lease.message.id,
      deliveryCount: lease.deliveryCount,
      at: lease.startedAt,
      lane: subscription.lane,
      result,
    };
    for (const listener of this.#listeners) {
      // An observer's bug must not break deliveries or starve later observers.
      try {
        listener(event);
      } catch {}
    }
  }

  #settle(subscription: Subscription, message: Message, result: DeliveryEvent["result"]): void {
    if (result.outcome !== "thrown" && result.ack) {
      const index = subscription.messages.indexOf(message);
      if (index >= 0) subscription.messages.splice(index, 1);
      return;
    }
    const now = this.#clock.now();
    if (result.outcome === "retry" || result.outcome === "rate_limited" || result.outcome === "deferred") {
      // A delay the transport cannot honour falls back to the visibility timeout.
      const delay =
        Number.isFinite(result.retryAfterMs) && result.retryAfterMs >= 0
          ? result.retryAfterMs
          : this.#visibilityTimeoutMs;
      message.visibleAt = now + delay;
      // A deferral (rate limit, handler never started) is not an attempt: the
      // next delivery keeps this count, and knows one more deferral preceded it.
      if (!result.spendsAttempt) {
        message.deliveries -= 1;
        message.deferrals = (message.deferrals ?? 0) + 1;
      }
    } else {
      message.visibleAt = now + this.#visibilityTimeoutMs;
    }
  }

  /**
   * The next clock time something happens by itself: a waiting message
   * becomes visible, or a delivery in flight reaches its visibility timeout.
   */
  #nextWakeAt(): number | undefined {
    const now = this.#clock.now();
    let next: number | undefined;
    const consider = (t: number) => {
      if (t > now && (next === undefined || t < next)) next = t;
    };
    const due = (t: number) => {
      if (next === undefined || t < next) next = t;
    };
    for (const s of this.#lanes()) {
      // Time passes between the pump's reading of the clock and this one (a
      // loaded machine can pause between the two): a message that came due
      // meanwhile, with a slot free to take it, is due now, and a lease that
      // expired meanwhile is reaped now. Were either left out, no timer would
      // start it and drain() would wait forever.
      const startable = s.leases.size < s.concurrency && !(s.live && this.#waiting(s.live, now));
      for (const m of s.messages) {
        if (m.inFlight) continue;
        if (m.visibleAt > now) consider(m.visibleAt);
        else if (startable) due(now);
      }
      for (const lease of s.leases) due(Math.max(lease.expiresAt, now));
    }
    // A message visible now without a free slot waits for one: it frees when a
    // delivery settles (which pumps) or at a lease's expiry (counted above).
    return next;
  }

  /** After any change: wake drain() waiters when idle, and (real clock) arm a timer for the next due message. */
  #afterChange(): void {
    if (!this.#busy()) {
      for (const resolve of this.#idleWaiters) resolve();
      this.#idleWaiters.clear();
    }
    if (this.#clock.onAdvance || this.#closed) return;
    const next = this.#nextWakeAt();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (next !== undefined) {
      // Clamped to the timer limit (a longer delay would fire after 1 ms, over
      // and over): firing early pumps nothing, and the pump arms the next one.
      this.#timer = setTimeout(() => this.#pumpAll(), timerDelay(next - this.#clock.now()));
      this.#timer.unref();
    }
  }

  /**
   * A delivery in flight that is not stuck, or a visible message that a free
   * concurrency slot could take now (slots held by stuck deliveries free at
   * their visibility timeout; a replay waits while live messages wait).
   */
  #busy(): boolean {
    for (const lease of this.#inFlight) if (!lease.stuck) return true;
    const now = this.#clock.now();
    for (const s of this.#lanes()) {
      if (s.leases.size >= s.concurrency) continue;
      // A replay lane yielding to live messages that wait for a slot cannot start anything now.
      if (s.live && this.#waiting(s.live, now)) continue;
      if (s.messages.some((m) => !m.inFlight && m.visibleAt <= now)) return true;
    }
    return false;
  }

  /** Resolves once no delivery is in flight (stuck ones aside) and nothing visible waits for a free slot. */
  #idle(): Promise<void> {
    if (!this.#busy()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.add(resolve));
  }
}

/** Creates an in-process queue. */
export function createMemoryQueue(options: MemoryQueueOptions = {}): MemoryQueue {
  return new InMemoryQueue(options);
}
