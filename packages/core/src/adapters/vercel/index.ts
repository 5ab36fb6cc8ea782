/**
 * The Vercel Queues adapter (`@vercel/queue` 0.6.0; decisions in ADR 0004,
 * what it assumes about the service in ADR 0009).
 * - `publish` / `schedule`: the QueuePort, through the SDK's `send`;
 * - `pushHandler(bound)`: a Next.js App Router route handler for a vercel.json
 *   queue trigger (`vercelTrigger` writes the trigger block);
 * - `startWorker(bound)`: a poll loop for long-running processes;
 *   `receiveAvailable(bound)` drains once (cron).
 * Both delivery modes run one lease lifecycle of the adapter's own on the
 * SDK's API client (confirm the lease, renew it while the handler runs, wait
 * for a renewal in flight, then apply the directive, and report a failed
 * directive): the SDK's own lifecycle trusts a push callback's body without
 * asking the service, lets a renewal overwrite the directive, and only
 * `console.warn`s a failed acknowledgement.
 * Vercel Queues has no dead-letter queue: a message vanishes when its
 * retention ends or its trigger's `maxDeliveries` is spent. So the adapter
 * never asks for a redelivery that cannot come: it republishes a fresh copy
 * carrying the attempts spent, and if even that fails, has the harness write
 * the dead letter now (`BoundConsumer.deadLetterNow`).
 * The push route and `receiveAvailable` answer only once the alerts of the
 * dead letters they wrote are delivered or durably counted
 * (`BoundConsumer.flushAlerts`): the function may end as soon as it answers.
 *
 * Glossary: topic = a Vercel queue name ([A-Za-z0-9_-]+), mapped reversibly
 * from our queue names; lease = a received message's lock, identified by its
 * receipt handle; wrapper = a message body the adapter made around a job's
 * bytes: a deferral (a republished copy addressed to one consumer, carrying
 * the attempts already spent and the deferrals so far), a replay, or a
 * delayed message carrying its due time; hop = a republish of a message that
 * came due before its time (a delay longer than one message can wait).
 *
 * Files, by role (this one only re-exports; each file imports only files
 * listed above it, so there is no cycle):
 * - topics.ts: queue and consumer names ↔ Vercel topics, replay topics;
 * - wrapper.ts: the signed wrapper codec (deferrals, hops, rescues, delayed
 *   and addressed publishes);
 * - types.ts: the public interfaces (the queue, its workers, incidents,
 *   delivery events, route options);
 * - config.ts: the service's limits and the adapter's, the options, and
 *   `resolveVercelQueueConfig`, which reads and checks them once;
 * - service.ts: the SDK's client and wire format: raw bytes, the lease API,
 *   errors read by name, and the send (201 with an id stored, any other
 *   answer not known stored);
 * - incidents.ts: incidents (counted, logged, metrics, `onIncident`) and
 *   `onDelivery` listeners;
 * - lane.ts: a consumer bound to a delivery mode (`bindLane` and its checks),
 *   what a delivery ends with, the dead-letter alert flush;
 * - holds.ts: transport holds (a delivery kept without spending an attempt);
 * - republish.ts: one delivery's decision, and which path reads which answer
 *   of a republish (a hop, a deferral, a retry past the lease, a rescue
 *   before the service drops the message);
 * - lease.ts: one leased message start to end (confirm, renew, wait for the
 *   renewal in flight, apply the directive, report);
 * - push.ts: the route handler; poll.ts: the poll loops and `receiveAvailable`;
 * - triggers.ts: vercel.json trigger blocks;
 * - queue.ts: the adapter (publish, schedule, publishReplay, close),
 *   composing the others, and `createVercelQueue`.
 */

export {
  DEFAULT_MAX_DELIVERIES,
  resolveVercelQueueConfig,
  VERCEL_MAX_MESSAGE_BYTES,
  VERCEL_MAX_RETENTION_SECONDS,
  VERCEL_MAX_VISIBILITY_SECONDS,
  type VercelQueueConfig,
  type VercelQueueOptions,
} from "./config.ts";
export { createVercelQueue } from "./queue.ts";
export { fromVercelTopic, toVercelReplayTopic, toVercelTopic } from "./topics.ts";
export {
  type VercelFunctionsConfig,
  type VercelTrigger,
  type VercelTriggerOptions,
  vercelFunctionsConfig,
  vercelTrigger,
} from "./triggers.ts";
export type {
  VercelDeliveryEvent,
  VercelIncident,
  VercelQueue,
  VercelRouteOptions,
  VercelWorker,
  VercelWorkerHealth,
  VercelWorkerOptions,
} from "./types.ts";
// WRAPPER_RESERVE_BYTES: room kept in every message for the wrapper the
// adapter may put around it (a deferral, a replay, a hop).
export { readVercelWrapper, type VercelWrapper, WRAPPER_RESERVE_BYTES } from "./wrapper.ts";
