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
 *
 * This file only re-exports. One file per role: `options.ts` (the options,
 * their defaults and checks), `queue.ts` (the queue: publish, schedule, the
 * replay lane's publish, a replay delivered once, subscribe, close),
 * `routing.ts` (which lanes a message goes to; held messages), `lanes.ts`
 * (messages, leases, lanes), `delivery.ts` (the delivery loop: slots, leases
 * and their expiry, results), `wake.ts` (the next due time, the real-clock
 * timer, `drain()`), `events.ts` (`onDelivery` observers).
 */
export type { DeliveryEvent } from "./events.ts";
export type { MemoryQueueOptions } from "./options.ts";
export { createMemoryQueue, type MemoryQueue, type ReplayDelivery } from "./queue.ts";
