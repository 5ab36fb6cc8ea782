/**
 * Where a message goes: every subscribed consumer of a queue has a live lane
 * and a replay lane, each with its own copy of what is addressed to it (like
 * consumer groups); a message nobody can take yet is held for the first
 * subscriber.
 */
import { InvalidConfigError } from "../../errors.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { type Message, Subscription } from "./lanes.ts";

const laneKey = (queue: string, consumer: string) => `${queue}\u0000${consumer}`;

/** The lanes a publish puts its message on. */
export interface Route {
  /** The target consumer's replay lane, for a replay addressed to it. */
  readonly lane: Subscription | undefined;
  /** The lanes that each get a copy; none: the message is held until someone subscribes. */
  readonly subscriptions: readonly Subscription[];
}

export class Routes {
  readonly #subscriptions = new Map<string, Subscription[]>();
  /** Each subscribed consumer's replay lane, by queue and consumer. */
  readonly #replayLanes = new Map<string, Subscription>();
  readonly #unrouted = new Map<string, Message[]>();

  /** Every subscription: the live ones and the replay lanes. */
  *all(): Generator<Subscription> {
    for (const list of this.#subscriptions.values()) yield* list;
    yield* this.#replayLanes.values();
  }

  /** The live lanes of a queue's subscribed consumers. */
  live(queue: string): readonly Subscription[] {
    return this.#subscriptions.get(queue) ?? [];
  }

  /** Whether `consumer` of `queue` is subscribed here (its replays have a reader). */
  has(queue: string, consumer: string): boolean {
    return this.#replayLanes.has(laneKey(queue, consumer));
  }

  /**
   * The lanes a message for `queue` goes to. Throws `InvalidConfigError` when
   * it is addressed to a consumer that is not subscribed while others are.
   */
  route(queue: string, target: string | undefined, replay: boolean): Route {
    // A replay addressed to one consumer goes to that consumer's replay lane.
    const lane = replay && target !== undefined ? this.#replayLanes.get(laneKey(queue, target)) : undefined;
    const all = this.#subscriptions.get(queue) ?? [];
    const subscriptions = lane ? [lane] : target === undefined ? all : all.filter((s) => s.consumer.name === target);
    if (target !== undefined && all.length > 0 && subscriptions.length === 0) {
      throw new InvalidConfigError(
        `no consumer "${target}" is subscribed to "${queue}" here; the message would reach no one`,
      );
    }
    return { lane, subscriptions };
  }

  /** Keeps a message that no lane can take yet for the first consumer that subscribes to its queue. */
  hold(queue: string, message: Message): void {
    const held = this.#unrouted.get(queue) ?? [];
    held.push(message);
    this.#unrouted.set(queue, held);
  }

  /**
   * Adds the consumer's live lane and replay lane, and hands them the held
   * messages addressed to them (or to no one in particular).
   */
  add(
    consumer: BoundConsumer,
    concurrency: number,
    replayConcurrency: number,
  ): { readonly subscription: Subscription; readonly replayLane: Subscription } {
    const list = this.#subscriptions.get(consumer.queue) ?? [];
    if (list.some((s) => s.consumer.name === consumer.name)) {
      throw new InvalidConfigError(`consumer "${consumer.name}" is already subscribed to "${consumer.queue}"`);
    }
    const subscription = new Subscription(consumer, concurrency, "live");
    const replayLane = new Subscription(consumer, replayConcurrency, "replay");
    subscription.replays = replayLane;
    replayLane.live = subscription;
    const held = this.#unrouted.get(consumer.queue);
    if (held) {
      const rest: Message[] = [];
      for (const m of held) {
        if (m.target !== undefined && m.target !== consumer.name) rest.push(m);
        else (m.replay && m.target !== undefined ? replayLane : subscription).add(m);
      }
      if (rest.length > 0) this.#unrouted.set(consumer.queue, rest);
      else this.#unrouted.delete(consumer.queue);
    }
    list.push(subscription);
    this.#subscriptions.set(consumer.queue, list);
    this.#replayLanes.set(laneKey(consumer.queue, consumer.name), replayLane);
    return { subscription, replayLane };
  }

  /** Messages not yet acknowledged, per queue and consumer, held ones included. */
  pending(): number {
    let count = 0;
    for (const s of this.all()) count += s.size;
    for (const held of this.#unrouted.values()) count += held.length;
    return count;
  }
}
