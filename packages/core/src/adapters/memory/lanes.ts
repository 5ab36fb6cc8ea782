/**
 * What a lane holds: its messages, the deliveries in flight (leases), and the
 * link between a consumer's live lane and its replay lane. A lane finds its
 * next message without looking at the others: the ones visible now wait in a
 * heap by lane order, the later ones in a heap by visibility time.
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
  /** Its place in its lane's order (set when the lane takes it): the order visible messages start in. */
  seq?: number;
  /** Taken off its lane for good (acknowledged, or delivered once): a heap entry left behind is skipped. */
  gone?: boolean;
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

/** A binary min-heap: `before(a, b)` when a comes out first. */
export class MinHeap<T> {
  readonly #items: T[] = [];
  constructor(readonly before: (a: T, b: T) => boolean) {}

  get size(): number {
    return this.#items.length;
  }

  peek(): T | undefined {
    return this.#items[0];
  }

  push(item: T): void {
    const items = this.#items;
    let i = items.push(item) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.before(item, items[parent] as T)) break;
      items[i] = items[parent] as T;
      i = parent;
    }
    items[i] = item;
  }

  pop(): T | undefined {
    const items = this.#items;
    const top = items[0];
    const last = items.pop();
    if (items.length === 0 || last === undefined) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= items.length) break;
      const right = left + 1;
      const child = right < items.length && this.before(items[right] as T, items[left] as T) ? right : left;
      if (!this.before(items[child] as T, last)) break;
      items[i] = items[child] as T;
      i = child;
    }
    items[i] = last;
    return top;
  }
}

const bySeq = (a: Message, b: Message) => (a.seq ?? 0) < (b.seq ?? 0);
const byVisibleAt = (a: Message, b: Message) =>
  a.visibleAt < b.visibleAt || (a.visibleAt === b.visibleAt && (a.seq ?? 0) < (b.seq ?? 0));

export class Subscription {
  /** Messages of the lane not acknowledged yet, waiting or in flight. */
  #size = 0;
  /** The ones delivered once (`onSettled`), by id: their caller may take them off the lane. */
  readonly #once = new Map<string, Message>();
  readonly leases = new Set<Lease>();
  /** A replay lane's live lane (same consumer): replays wait while live messages wait for a slot. */
  live?: Subscription;
  /** A live lane's replay lane, pumped when a live slot frees. */
  replays?: Subscription;
  /**
   * The messages waiting (not in flight): visible ones by lane order, later
   * ones by (visibleAt, lane order). A message is moved to `#ready` once due;
   * one taken off the lane meanwhile stays in its heap until it reaches the top.
   */
  readonly #ready = new MinHeap<Message>(bySeq);
  readonly #delayed = new MinHeap<Message>(byVisibleAt);
  #seq = 0;

  constructor(
    readonly consumer: BoundConsumer,
    readonly concurrency: number,
    readonly lane: "live" | "replay",
  ) {}

  /** Takes a new message, after every message the lane already has; `now`: the clock, when known. */
  add(message: Message, now?: number): void {
    message.seq = this.#seq++;
    this.#size += 1;
    if (message.onSettled !== undefined) this.#once.set(message.id, message);
    this.wait(message, now);
  }

  /** Messages of the lane not acknowledged yet, waiting or in flight. */
  get size(): number {
    return this.#size;
  }

  /** A message delivered once (`onSettled`) still on the lane, by id. */
  once(id: string): Message | undefined {
    return this.#once.get(id);
  }

  /** A message of the lane not in flight (new, or its delivery over) waits until its `visibleAt`. */
  wait(message: Message, now = Number.NEGATIVE_INFINITY): void {
    (message.visibleAt <= now ? this.#ready : this.#delayed).push(message);
  }

  /** Takes a message off the lane for good (acknowledged, or delivered once). */
  delete(message: Message): void {
    if (message.gone) return;
    message.gone = true;
    this.#size -= 1;
    if (message.onSettled !== undefined) this.#once.delete(message.id);
  }

  /** The first visible message (lane order) no delivery holds, left where it is. */
  peek(now: number): Message | undefined {
    const ready = this.#ready;
    const delayed = this.#delayed;
    for (let m = delayed.peek(); m !== undefined && m.visibleAt <= now; m = delayed.peek()) {
      delayed.pop();
      if (this.#waits(m)) ready.push(m);
    }
    for (let m = ready.peek(); m !== undefined; m = ready.peek()) {
      if (!this.#waits(m)) {
        ready.pop();
        continue;
      }
      // Visible at a later reading of the clock than `now` (a caller's
      // earlier reading, or a wall clock set back): not visible yet after all.
      if (m.visibleAt > now) {
        ready.pop();
        delayed.push(m);
        continue;
      }
      return m;
    }
    return undefined;
  }

  /** Takes the first visible message no delivery holds out of the waiting ones (it is to start). */
  take(now: number): Message | undefined {
    const message = this.peek(now);
    if (message !== undefined) this.#ready.pop();
    return message;
  }

  /** The earliest time after `now` that a waiting message becomes visible. */
  nextVisibleAt(now: number): number | undefined {
    this.peek(now);
    const delayed = this.#delayed;
    for (let m = delayed.peek(); m !== undefined; m = delayed.peek()) {
      if (this.#waits(m)) return m.visibleAt;
      delayed.pop();
    }
    return undefined;
  }

  /** Still on the lane, and no delivery holds it. */
  #waits(message: Message): boolean {
    return !message.inFlight && message.gone !== true;
  }
}

/** A visible message of this lane that no slot has taken yet. */
export function waiting(subscription: Subscription, now: number): boolean {
  return subscription.peek(now) !== undefined;
}
