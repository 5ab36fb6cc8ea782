/** Test wiring: the Vercel adapter, through the real SDK, against the fake server. */
import { afterEach } from "vitest";
import {
  createVercelQueue,
  toVercelReplayTopic,
  toVercelTopic,
  type VercelQueue,
  type VercelQueueOptions,
} from "../src/adapters/vercel/index.ts";
import type { BoundConsumer } from "../src/queue-port.ts";
import { type FakeVercelQueues, type FakeVercelQueuesOptions, startFakeVercelQueues } from "./fake-vercel-queues.ts";
import { silentLogger } from "./fixtures.ts";
import type { ContractTransport } from "./queue-port-contract.ts";

export interface VercelHarness extends ContractTransport {
  readonly fake: FakeVercelQueues;
  readonly queue: VercelQueue;
}

/**
 * A Vercel adapter on a fresh fake server. `push`: each subscribed consumer
 * gets a route (`pushHandler`) that the fake calls like a vercel.json trigger;
 * `poll`: `settle()` drains each consumer with `receiveAvailable`.
 */
export async function vercelHarness(
  mode: "push" | "poll",
  options: Partial<VercelQueueOptions> & {
    /** The push trigger's retryAfterSeconds (fake subscription and route alike). */
    retryAfterSeconds?: number;
    /** The push trigger's maxDeliveries (fake subscription and route alike). */
    maxDeliveries?: number;
    /** How the fake server behaves (faults, limits, partitions). */
    fake?: FakeVercelQueuesOptions;
  } = {},
): Promise<VercelHarness> {
  const { retryAfterSeconds, maxDeliveries, fake: fakeOptions, ...adapterOptions } = options;
  const fake = await startFakeVercelQueues(fakeOptions);
  const queue = createVercelQueue({
    ...fake.clientOptions(),
    clock: fake.clock,
    logger: silentLogger,
    env: {},
    ...adapterOptions,
  });
  const polled: BoundConsumer[] = [];
  return {
    fake,
    queue,
    port: queue,
    subscribe(consumer) {
      if (mode === "push") {
        // One consumer group per consumer, as one route file per consumer is on Vercel.
        const trigger = {
          ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
          ...(maxDeliveries !== undefined ? { maxDeliveries } : {}),
        };
        const route = queue.pushHandler(consumer, trigger);
        const subscription = { group: `route_${toVercelTopic(consumer.name)}`, ...trigger };
        fake.subscribePush(toVercelTopic(consumer.queue), route, subscription);
        // The same route's second trigger: the consumer's replay topic (#10 item 3).
        fake.subscribePush(toVercelReplayTopic(consumer.queue, consumer.name), route, subscription);
      } else {
        polled.push(consumer);
        if (maxDeliveries !== undefined) {
          fake.setMaxDeliveries(toVercelTopic(consumer.queue), toVercelTopic(consumer.name), maxDeliveries);
          const replays = toVercelReplayTopic(consumer.queue, consumer.name);
          fake.setMaxDeliveries(replays, toVercelTopic(consumer.name), maxDeliveries);
        }
      }
    },
    async settle(horizonMs = 3_600_000) {
      const limit = fake.clock.now() + horizonMs;
      for (let round = 0; round < 10_000; round++) {
        if (mode === "push") await fake.dispatch();
        else {
          for (const consumer of polled) {
            await queue.receiveAvailable(consumer, {
              concurrency: 2,
              ...(maxDeliveries !== undefined ? { maxDeliveries } : {}),
            });
          }
        }
        const next = fake.nextVisibleAt();
        if (next === undefined || next > limit) return;
        fake.clock.advanceTo(next);
      }
      throw new Error("settle(): deliveries did not come to rest");
    },
    now: () => fake.clock.now(),
    async close() {
      await queue.close();
      await fake.close();
    },
  };
}

/** `open(mode, options)` makes a harness that is closed after the test (registers the afterEach hook). */
export function useVercelHarnesses() {
  let open: VercelHarness[] = [];
  afterEach(async () => {
    for (const h of open) await h.close();
    open = [];
  });
  return async (mode: "push" | "poll", options: Parameters<typeof vercelHarness>[1] = {}) => {
    const h = await vercelHarness(mode, options);
    open.push(h);
    return h;
  };
}
