/**
 * The adapter itself (`createVercelQueue`): the QueuePort's publish and
 * schedule and the replay lane's publishReplay, through the SDK's `send`
 * (service.ts), and the composition of the parts a delivery runs through —
 * the push route (push.ts) and the poll loops (poll.ts) on one lease
 * lifecycle (lease.ts), whose answers the republisher reads (republish.ts).
 */
import { type Clock, systemClock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { InvalidConfigError, InvalidEnvelopeError, QueueClosedError } from "../../errors.ts";
import { consoleLogger } from "../../ports/logger.ts";
import type { BoundConsumer, PublishOptions, PublishReceipt } from "../../queue-port.ts";
import {
  configOf,
  MAX_IDEMPOTENCY_KEY,
  maxBodyBytes,
  maxDelaySeconds,
  type VercelQueueConfig,
  type VercelQueueOptions,
} from "./config.ts";
import { Incidents } from "./incidents.ts";
import { LeaseRunner, type ModeContext } from "./lease.ts";
import { type CombinedWorker, type PollWorker, receiveAvailable, startWorker } from "./poll.ts";
import { pushHandler } from "./push.ts";
import { Republisher } from "./republish.ts";
import { VercelService } from "./service.ts";
import { toVercelReplayTopic, toVercelTopic } from "./topics.ts";
import type {
  VercelDeliveryEvent,
  VercelQueue,
  VercelRouteOptions,
  VercelWorker,
  VercelWorkerOptions,
} from "./types.ts";
import { WRAPPER_RESERVE_BYTES, WrapperCodec, type WrapperHead } from "./wrapper.ts";

class VercelQueueAdapter implements VercelQueue {
  readonly region: string;
  readonly #config: VercelQueueConfig;
  readonly #service: VercelService;
  readonly #wrappers: WrapperCodec;
  readonly #clock: Clock;
  readonly #incidents: Incidents;
  /** What the push route and the poll loops work with. */
  readonly #modes: ModeContext;
  readonly #workers = new Set<PollWorker | CombinedWorker>();
  #closed = false;

  constructor(options: VercelQueueOptions) {
    this.#config = configOf(options);
    this.region = this.#config.region;
    this.#clock = options.clock ?? systemClock;
    const logger = options.logger ?? consoleLogger;
    this.#incidents = new Incidents(logger, options.onIncident, options.metrics);
    this.#service = new VercelService(this.#config, options.resolveBaseUrl);
    this.#wrappers = new WrapperCodec(this.#config.wrapperSecret, {
      acceptUnsigned: this.#config.acceptUnsignedWrappers,
    });
    const context = { config: this.#config, clock: this.#clock, logger, incidents: this.#incidents };
    const lease = new LeaseRunner(context, new Republisher(context, this.#wrappers, this.#service));
    this.#modes = { ...context, api: this.#service.api, lease };
  }

  get transportHoldMs(): number {
    return this.#config.transportHoldMs;
  }

  async publish(queue: string, payload: Envelope, opts?: PublishOptions): Promise<PublishReceipt> {
    // Validate before anything else: an invalid envelope never becomes a message.
    const envelope = parseEnvelope(payload);
    if (this.#closed) throw new QueueClosedError();
    const topic = toVercelTopic(queue);
    const delayMs = opts?.delayMs ?? 0;
    if (!Number.isFinite(delayMs) || delayMs < 0) {
      throw new InvalidConfigError(`publish(${JSON.stringify(queue)}): delayMs must be a non-negative number`);
    }
    const key = opts?.idempotencyKey;
    if (key !== undefined && (typeof key !== "string" || key.length === 0 || key.length > MAX_IDEMPOTENCY_KEY)) {
      throw new InvalidConfigError(`publish(${JSON.stringify(queue)}): idempotencyKey must be 1-256 characters`);
    }
    const json = JSON.stringify(envelope);
    const size = Buffer.byteLength(json, "utf8");
    if (size > maxBodyBytes(this.#config)) {
      // Every message must fit a deferral or a replay later: one that could
      // not would have to wait on its lease (spending an attempt) or be lost.
      throw new InvalidEnvelopeError([
        `the envelope is ${size} bytes; Vercel Queues carries at most ${this.#config.maxMessageBytes} bytes per message, less ${WRAPPER_RESERVE_BYTES} kept for the adapter's wrapper (deferrals, replays)`,
      ]);
    }
    const target = opts?.targetConsumer;
    if (target !== undefined) toVercelTopic(target); // a consumer name that cannot exist here is refused now
    if (opts?.replay === true && target === undefined) {
      throw new InvalidConfigError(
        `publish(${JSON.stringify(queue)}): a replay must name its targetConsumer (the replay mark travels in the addressed wrapper)`,
      );
    }
    // Rounded up: a message is never delivered before it was asked to be.
    const delaySeconds = Math.ceil(delayMs / 1000);
    const now = this.#clock.now();
    // A plain message stays the envelope's bytes. One addressed to a consumer
    // (a replay), or delayed (its due time must travel: the service reports
    // only when it was sent), goes in a wrapper.
    if (target === undefined && delaySeconds === 0) return this.#service.send(topic, Buffer.from(json, "utf8"), 0, key);
    const head: WrapperHead = {
      consumer: target,
      attemptsSpent: 0,
      deferrals: 0,
      ...(delaySeconds > 0 ? { dueAt: now + delayMs } : {}),
      ...(opts?.replay === true ? { replay: true } : {}),
    };
    return this.#sendDelayed(topic, head, json, delaySeconds, key);
  }

  async schedule(queue: string, payload: Envelope, runAt: Date): Promise<PublishReceipt> {
    if (!(runAt instanceof Date) || Number.isNaN(runAt.getTime())) {
      throw new InvalidConfigError(`schedule(${JSON.stringify(queue)}): runAt must be a valid Date`);
    }
    // Any distance ahead: beyond what one message can wait, it travels in hops.
    return this.publish(queue, payload, { delayMs: Math.max(0, runAt.getTime() - this.#clock.now()) });
  }

  async publishReplay(
    queue: string,
    body: string | Uint8Array,
    opts: { readonly targetConsumer: string },
  ): Promise<PublishReceipt> {
    if (this.#closed) throw new QueueClosedError();
    const topic = toVercelReplayTopic(queue, opts?.targetConsumer);
    // The letter's bytes as they are: on the consumer's own replay topic the
    // message needs no wrapper to say whom it is for, or that it is a replay.
    const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
    if (bytes.byteLength > maxBodyBytes(this.#config)) {
      throw new InvalidEnvelopeError([
        `the payload is ${bytes.byteLength} bytes; Vercel Queues carries at most ${this.#config.maxMessageBytes} bytes per message, less ${WRAPPER_RESERVE_BYTES} kept for the adapter's wrapper (deferrals)`,
      ]);
    }
    return this.#service.send(topic, bytes, 0, undefined);
  }

  /**
   * Sends a wrapper with a delay; a delay longer than one message can carry
   * is sent as far as it can go, with `not_before`, and the consumer that
   * receives it early republishes it for the rest (a hop).
   */
  #sendDelayed(
    topic: string,
    head: WrapperHead,
    body: string | Uint8Array,
    delaySeconds: number,
    idempotencyKey: string | undefined,
  ): Promise<PublishReceipt> {
    const hop = delaySeconds > maxDelaySeconds(this.#config);
    const wrapped = this.#wrappers.encode(
      hop ? { ...head, notBefore: this.#clock.now() + delaySeconds * 1000 } : head,
      body,
    );
    return this.#service.send(topic, wrapped, hop ? maxDelaySeconds(this.#config) : delaySeconds, idempotencyKey);
  }

  pushHandler(consumer: BoundConsumer, route: VercelRouteOptions = {}): (request: Request) => Promise<Response> {
    return pushHandler(this.#modes, consumer, route);
  }

  startWorker(consumer: BoundConsumer, options: VercelWorkerOptions = {}): VercelWorker {
    if (this.#closed) throw new QueueClosedError();
    const worker = startWorker(this.#modes, consumer, options);
    this.#workers.add(worker);
    void worker.done.finally(() => this.#workers.delete(worker));
    return worker;
  }

  async receiveAvailable(
    consumer: BoundConsumer,
    options: { readonly concurrency?: number; readonly maxDeliveries?: number } = {},
  ): Promise<number> {
    return receiveAvailable(this.#modes, consumer, options);
  }

  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void {
    return this.#incidents.onDelivery(listener);
  }

  incidentCounts(): Readonly<Record<string, number>> {
    return this.#incidents.counts();
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.all([...this.#workers].map((w) => w.stop()));
  }
}

/**
 * Creates the Vercel Queues adapter. Reads and checks its configuration now
 * (`InvalidConfigError` listing what is missing), so a module fails at start;
 * or takes the one `resolveVercelQueueConfig` already read (`options.config`).
 */
export function createVercelQueue(options: VercelQueueOptions = {}): VercelQueue {
  return new VercelQueueAdapter(options);
}
