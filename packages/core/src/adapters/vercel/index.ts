/**
 * The Vercel Queues adapter (`@vercel/queue` 0.6.0; decisions in ADR 0004).
 * - `publish` / `schedule`: the QueuePort, through the SDK's `send`;
 * - `pushHandler(bound)`: a Next.js App Router route handler for a vercel.json
 *   queue trigger, built on the SDK's `handleCallback`;
 * - `startWorker(bound)`: a poll loop for long-running processes, on
 *   `PollingQueueClient.receive`; `receiveAvailable(bound)` drains once (cron).
 * Both delivery modes map the harness's `DeliveryResult` to the SDK's retry
 * directives the same way, and keep rate-limit deferrals from counting as
 * attempts by republishing (Vercel's delivery count cannot be corrected).
 * The push route and `receiveAvailable` answer only once the alerts of the
 * dead letters they wrote are delivered or durably counted
 * (`BoundConsumer.flushAlerts`): the function may end as soon as it answers.
 *
 * Glossary: topic = a Vercel queue name ([A-Za-z0-9_-]+), mapped reversibly
 * from our queue names; lease = a received message's lock, identified by its
 * receipt handle; deferral = a republished copy of a message, addressed to one
 * consumer, carrying the attempts already spent and the deferrals so far
 * (`Delivery.deferrals`).
 */
import { createHash } from "node:crypto";
import {
  type MessageMetadata,
  PollingQueueClient,
  QueueClient,
  type RetryDirective,
  type Transport,
} from "@vercel/queue";
import { type Clock, systemClock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { describeError, InvalidConfigError, QueueClosedError } from "../../errors.ts";
import { consoleLogger, type Logger } from "../../ports/logger.ts";
import type {
  BoundConsumer,
  DeliveryResult,
  PublishOptions,
  PublishReceipt,
  QueuePort,
  ReplayLanePort,
} from "../../queue-port.ts";
import { nonNegative, positiveInteger } from "../../validate.ts";

/** Longest retention Vercel Queues keeps a message (7 days); a delay may not exceed the retention. */
export const VERCEL_MAX_RETENTION_SECONDS = 604_800;
/** Longest lease (visibility timeout) the SDK documents; a retry directive cannot wait longer. */
export const VERCEL_MAX_VISIBILITY_SECONDS = 3_600;
const MIN_RETENTION_SECONDS = 60;
const MIN_VISIBILITY_SECONDS = 30;
const MAX_IDEMPOTENCY_KEY = 256;
/** Clock difference tolerated between the service's timestamps and ours when reading a due time. */
const DUE_AT_SKEW_MS = 300_000;
const REGION_PATTERN = /^[a-z]{2,5}[0-9]{1,2}$/;
/** Longest a push request or `receiveAvailable` waits for its dead-letter alerts before it answers anyway. */
const ALERT_FLUSH_TIMEOUT_MS = 10_000;

export interface VercelQueueOptions {
  /** Vercel region of the queues. @default env VERCEL_REGION (set by Vercel in functions); required */
  readonly region?: string;
  /** API token. @default OIDC: env VERCEL_OIDC_TOKEN, or the per-request token on Vercel (VERCEL=1) */
  readonly token?: string;
  /** Deployment the sends are pinned to; `null` sends unpinned. @default env VERCEL_DEPLOYMENT_ID; required unless null */
  readonly deploymentId?: string | null;
  /** Where the API lives. @default the SDK's `https://{region}.vercel-queue.com` */
  readonly resolveBaseUrl?: (region: string) => URL;
  /**
   * How long a message lives once it is visible: the window for its deliveries
   * and retries. A delayed message is sent with delay + this, so the longest
   * `schedule()` horizon is 604800 − this. @default 86_400 (60..604800)
   */
  readonly retentionSeconds?: number;
  /** Lease taken per delivery; the SDK extends it while the handler runs. @default 300 (30..3600) */
  readonly visibilityTimeoutSeconds?: number;
  /** For `schedule()`'s runAt − now. @default the system clock */
  readonly clock?: Clock;
  /** Where the configuration is read from. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** @default console */
  readonly logger?: Logger;
}

export interface VercelWorkerOptions {
  /** Lanes, each receiving and running one message at a time. @default 4 */
  readonly concurrency?: number;
  /** Wait after an empty receive before asking again. @default 1_000 */
  readonly idleDelayMs?: number;
  /** Wait after a failed receive (network, 5xx) before asking again. @default 5_000 */
  readonly errorDelayMs?: number;
  /**
   * Lanes receiving the consumer's replay topic (`toVercelReplayTopic`), apart
   * from `concurrency`: replays never take live lanes (SPEC §5). 0 starts
   * none (another worker or a route serves the replay topic). @default 1
   */
  readonly replayConcurrency?: number;
}

export interface VercelWorker {
  /** Lanes busy receiving or delivering right now. */
  readonly inFlight: number;
  /** Stops receiving and resolves when the deliveries in flight have finished (and been acknowledged or not). */
  stop(): Promise<void>;
}

/** What the adapter did with one delivery, for observers (logs, tests). */
export interface VercelDeliveryEvent {
  readonly queue: string;
  readonly consumer: string;
  readonly messageId: string;
  /** The attempt number handed to the harness (deferrals included). */
  readonly deliveryCount: number;
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
  /**
   * `ack`: acknowledged; `visibility`: the lease was moved `afterSeconds` ahead;
   * `deferred`: republished with a delay, then acknowledged; `none`: left to
   * the service's redelivery.
   */
  readonly action: "ack" | "visibility" | "deferred" | "none";
  readonly afterSeconds?: number;
}

export interface VercelQueue extends QueuePort, ReplayLanePort {
  readonly region: string;
  /**
   * A route handler (`export const POST = …`) delivering a vercel.json
   * trigger's messages to `consumer`: those of its queue's topic, and those of
   * its replay topic (`toVercelReplayTopic`) — give the replay topic its own
   * trigger (with its own concurrency) on the same route.
   */
  pushHandler(consumer: BoundConsumer): (request: Request) => Promise<Response>;
  /** Starts a poll loop delivering `consumer`'s queue (consumer group = its mapped name) until `stop()`. */
  startWorker(consumer: BoundConsumer, options?: VercelWorkerOptions): VercelWorker;
  /** Receives until the queue reports empty, `concurrency` at a time (e.g. from a cron function). Returns the deliveries made. */
  receiveAvailable(consumer: BoundConsumer, options?: { readonly concurrency?: number }): Promise<number>;
  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void;
  /** Refuses further publishes and stops every worker started here. */
  close(): Promise<void>;
}

// ---------------------------------------------------------------------------
// Names

/**
 * Maps a queue or consumer name to a Vercel topic / consumer-group name, the
 * way Vercel encodes route files as consumer groups: `_` → `__`, `.` → `_D`,
 * `:` → `_3A`. Throws `InvalidConfigError` for a name it cannot map.
 */
export function toVercelTopic(name: string): string {
  if (typeof name !== "string" || name.length === 0) {
    throw new InvalidConfigError(`cannot map ${JSON.stringify(name)} to a Vercel topic: it must be a non-empty string`);
  }
  let out = "";
  for (const ch of name) {
    if (/[A-Za-z0-9-]/.test(ch)) out += ch;
    else if (ch === "_") out += "__";
    else if (ch === ".") out += "_D";
    else if (ch === ":") out += "_3A";
    else {
      throw new InvalidConfigError(
        `cannot map ${JSON.stringify(name)} to a Vercel topic: ${JSON.stringify(ch)} is not one of letters, digits, . _ : -`,
      );
    }
  }
  return out;
}

/**
 * The replay topic of one consumer of a queue (#10 item 3): replays travel
 * apart from live traffic, on a topic only that consumer reads, with the
 * letter's bytes unwrapped. `_R` never occurs in a name `toVercelTopic` makes,
 * so no queue's topic can collide with a replay topic.
 */
export function toVercelReplayTopic(queue: string, consumer: string): string {
  return `${toVercelTopic(queue)}_R${toVercelTopic(consumer)}`;
}

/** The inverse of `toVercelTopic`. Throws `InvalidConfigError` for a topic it did not make. */
export function fromVercelTopic(topic: string): string {
  let out = "";
  for (let i = 0; i < topic.length; i++) {
    const ch = topic[i] as string;
    if (ch !== "_") {
      if (!/[A-Za-z0-9-]/.test(ch)) break;
      out += ch;
      continue;
    }
    const next = topic[i + 1];
    if (next === "_") out += "_";
    else if (next === "D") out += ".";
    else if (next === "3" && topic[i + 2] === "A") {
      out += ":";
      i += 1;
    } else throw new InvalidConfigError(`${JSON.stringify(topic)} is not a topic made by toVercelTopic`);
    i += 1;
  }
  if (out.length === 0 || toVercelTopic(out) !== topic) {
    throw new InvalidConfigError(`${JSON.stringify(topic)} is not a topic made by toVercelTopic`);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Configuration

export interface VercelQueueConfig {
  readonly region: string;
  readonly token: string | undefined;
  readonly deploymentId: string | null;
  readonly retentionSeconds: number;
  readonly visibilityTimeoutSeconds: number;
}

/**
 * Reads and checks the configuration the SDK needs, so that a missing region,
 * credential or deployment id fails when the module binds its adapter, not on
 * the first message. Throws one `InvalidConfigError` listing every problem.
 */
export function resolveVercelQueueConfig(options: VercelQueueOptions = {}): VercelQueueConfig {
  const env = options.env ?? process.env;
  const problems: string[] = [];
  const region = options.region ?? env["VERCEL_REGION"];
  if (!region) {
    problems.push("region: pass options.region or set VERCEL_REGION (e.g. iad1; Vercel sets it in functions)");
  } else if (!REGION_PATTERN.test(region)) {
    problems.push(`region: ${JSON.stringify(region)} is not a Vercel region code (e.g. iad1, fra1)`);
  }
  const token = options.token ?? undefined;
  if (token === "") problems.push("token: options.token is empty");
  const oidc = env["VERCEL_OIDC_TOKEN"];
  const onVercel = env["VERCEL"] === "1";
  if (token === undefined && !oidc && !onVercel) {
    problems.push(
      "credentials: pass options.token, set VERCEL_OIDC_TOKEN (`vercel env pull`), or run on Vercel (VERCEL=1), where each request carries an OIDC token",
    );
  }
  let deploymentId: string | null;
  if (options.deploymentId === null) deploymentId = null;
  else {
    deploymentId = options.deploymentId ?? env["VERCEL_DEPLOYMENT_ID"] ?? "";
    if (deploymentId === "") {
      problems.push(
        "deployment: set VERCEL_DEPLOYMENT_ID, pass options.deploymentId, or pass deploymentId: null to send unpinned",
      );
    }
  }
  const retentionSeconds = options.retentionSeconds ?? 86_400;
  if (
    !Number.isInteger(retentionSeconds) ||
    retentionSeconds < MIN_RETENTION_SECONDS ||
    retentionSeconds > VERCEL_MAX_RETENTION_SECONDS
  ) {
    problems.push(
      `retentionSeconds: must be an integer in ${MIN_RETENTION_SECONDS}..${VERCEL_MAX_RETENTION_SECONDS}, got ${retentionSeconds}`,
    );
  }
  const visibilityTimeoutSeconds = options.visibilityTimeoutSeconds ?? 300;
  if (
    !Number.isInteger(visibilityTimeoutSeconds) ||
    visibilityTimeoutSeconds < MIN_VISIBILITY_SECONDS ||
    visibilityTimeoutSeconds > VERCEL_MAX_VISIBILITY_SECONDS
  ) {
    problems.push(
      `visibilityTimeoutSeconds: must be an integer in ${MIN_VISIBILITY_SECONDS}..${VERCEL_MAX_VISIBILITY_SECONDS}, got ${visibilityTimeoutSeconds}`,
    );
  }
  if (problems.length > 0) {
    throw new InvalidConfigError(`Vercel Queues adapter is not configured:\n- ${problems.join("\n- ")}`);
  }
  return { region: region as string, token, deploymentId, retentionSeconds, visibilityTimeoutSeconds };
}

// ---------------------------------------------------------------------------
// Wire format

/**
 * Bytes in, bytes out: the SDK's JsonTransport would throw on a body that is
 * not JSON before our handler runs, and the message would loop instead of
 * becoming a poison dead letter with its payload exactly as received.
 */
const rawTransport: Transport<Uint8Array> = {
  contentType: "application/json",
  serialize: (value) => Buffer.from(value.buffer, value.byteOffset, value.byteLength),
  async deserialize(stream) {
    const chunks: Uint8Array[] = [];
    for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(chunk);
    return Buffer.concat(chunks);
  },
};

const DEFERRAL_MARK = '{"softcrum_deferral":1,';
const utf8 = new TextDecoder("utf-8", { fatal: true });

interface Deferral {
  readonly consumer: string;
  readonly attemptsSpent: number;
  /** Earlier deliveries that ended deferred without spending an attempt; 0 when absent (older wrappers). */
  readonly deferrals: number;
  readonly body: string | Uint8Array;
  /** When the original message was due (ms since the epoch): a deferral does not make a job younger. */
  readonly dueAt?: number;
  /** An operator's replay (`PublishOptions.replay`), kept through deferrals. */
  readonly replay?: boolean;
}

/** The provider idempotency key of a deferral: one per consumer, message and delivery, within the SDK's 256 characters. */
function deferralKey(consumer: string, messageId: string, deliveryCount: number): string {
  const key = `softcrum-deferral:${consumer}:${messageId}:${deliveryCount}`;
  return key.length <= 256 ? key : `softcrum-deferral:${createHash("sha256").update(key).digest("hex")}`;
}

function encodeDeferral(
  consumer: string,
  attemptsSpent: number,
  body: string | Uint8Array,
  meta: Pick<Deferral, "dueAt" | "replay"> & { readonly deferrals?: number } = {},
): Buffer {
  let text: string;
  let encoding: "utf8" | "base64";
  if (typeof body === "string") {
    text = body;
    encoding = "utf8";
  } else {
    try {
      text = utf8.decode(body);
      encoding = "utf8";
    } catch {
      text = Buffer.from(body).toString("base64");
      encoding = "base64";
    }
  }
  // The mark must stay the first bytes: readDeferral looks for it before parsing.
  // deferrals, due_at and replay are optional: readers that predate them ignore them.
  const fields = {
    consumer,
    attempts_spent: attemptsSpent,
    ...(meta.deferrals !== undefined && meta.deferrals > 0 ? { deferrals: meta.deferrals } : {}),
    ...(meta.dueAt !== undefined ? { due_at: meta.dueAt } : {}),
    ...(meta.replay ? { replay: true } : {}),
    encoding,
    body: text,
  };
  const json = `${DEFERRAL_MARK}${JSON.stringify(fields).slice(1)}`;
  return Buffer.from(json, "utf8");
}

/** The deferral a body carries, or undefined for an ordinary message (anything malformed is ordinary: the harness judges it). */
function readDeferral(bytes: Uint8Array): Deferral | undefined {
  if (bytes.length < DEFERRAL_MARK.length) return undefined;
  const head = Buffer.from(bytes.buffer, bytes.byteOffset, DEFERRAL_MARK.length).toString("latin1");
  if (head !== DEFERRAL_MARK) return undefined;
  try {
    const value = JSON.parse(Buffer.from(bytes).toString("utf8")) as Record<string, unknown>;
    const { consumer, attempts_spent: spent, deferrals: deferred = 0, encoding, body, due_at: dueAt, replay } = value;
    if (typeof consumer !== "string" || typeof body !== "string") return undefined;
    if (typeof spent !== "number" || !Number.isInteger(spent) || spent < 0) return undefined;
    if (typeof deferred !== "number" || !Number.isInteger(deferred) || deferred < 0) return undefined;
    const head = {
      consumer,
      attemptsSpent: spent,
      deferrals: deferred,
      ...(typeof dueAt === "number" && Number.isFinite(dueAt) ? { dueAt } : {}),
      ...(replay === true ? { replay: true } : {}),
    };
    if (encoding === "utf8") return { ...head, body };
    if (encoding === "base64") return { ...head, body: new Uint8Array(Buffer.from(body, "base64")) };
    return undefined;
  } catch {
    return undefined;
  }
}

/** Thrown from the SDK handler so that the `retry` hook hands the SDK this directive. */
class Directive extends Error {
  constructor(readonly directive: RetryDirective) {
    super("softcrum directive");
  }
}

/** Thrown from the SDK handler when the message must not be acknowledged: the service redelivers it. */
class NotAcknowledged extends Error {
  override readonly name = "NotAcknowledged";
}

const directiveOf = (error: unknown): RetryDirective | undefined =>
  error instanceof Directive ? error.directive : undefined;

// ---------------------------------------------------------------------------
// The adapter

class VercelQueueAdapter implements VercelQueue {
  readonly region: string;
  readonly #config: VercelQueueConfig;
  readonly #options: VercelQueueOptions;
  readonly #client: QueueClient;
  #poller: PollingQueueClient | undefined;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #listeners = new Set<(event: VercelDeliveryEvent) => void>();
  readonly #workers = new Set<VercelWorker>();
  #closed = false;

  constructor(options: VercelQueueOptions) {
    this.#config = resolveVercelQueueConfig(options);
    this.#options = options;
    this.region = this.#config.region;
    this.#clock = options.clock ?? systemClock;
    this.#logger = options.logger ?? consoleLogger;
    this.#client = new QueueClient(this.#clientOptions());
  }

  #clientOptions() {
    return {
      region: this.#config.region,
      deploymentId: this.#config.deploymentId,
      transport: rawTransport as Transport,
      ...(this.#config.token !== undefined ? { token: this.#config.token } : {}),
      ...(this.#options.resolveBaseUrl ? { resolveBaseUrl: this.#options.resolveBaseUrl } : {}),
    };
  }

  /** Longest delay a publish may ask for: the retention left after the delivery window. */
  get #horizonSeconds(): number {
    return VERCEL_MAX_RETENTION_SECONDS - this.#config.retentionSeconds;
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
    // Rounded up: a message is never delivered before it was asked to be.
    const delaySeconds = Math.ceil(delayMs / 1000);
    if (delaySeconds > this.#horizonSeconds) {
      throw new InvalidConfigError(
        `publish(${JSON.stringify(queue)}): a delay of ${delaySeconds} s is beyond the Vercel Queues horizon of ${this.#horizonSeconds} s (messages live at most ${VERCEL_MAX_RETENTION_SECONDS} s, and ${this.#config.retentionSeconds} s are kept for delivery and retries)`,
      );
    }
    const key = opts?.idempotencyKey;
    if (key !== undefined && (typeof key !== "string" || key.length === 0 || key.length > MAX_IDEMPOTENCY_KEY)) {
      throw new InvalidConfigError(`publish(${JSON.stringify(queue)}): idempotencyKey must be 1-256 characters`);
    }
    const json = JSON.stringify(envelope);
    const target = opts?.targetConsumer;
    if (target !== undefined) toVercelTopic(target); // a consumer name that cannot exist here is refused now
    if (opts?.replay === true && target === undefined) {
      throw new InvalidConfigError(
        `publish(${JSON.stringify(queue)}): a replay must name its targetConsumer (the replay mark travels in the addressed wrapper)`,
      );
    }
    // Addressed to one consumer (a replay): every consumer group gets the
    // message, so it travels in the same addressed wrapper as a deferral with
    // no attempt spent, and the others acknowledge it without running.
    const body =
      target === undefined
        ? Buffer.from(json, "utf8")
        : encodeDeferral(target, 0, json, { replay: opts?.replay === true });
    return this.#send(topic, body, delaySeconds, key);
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
    return this.#send(topic, bytes, 0, undefined);
  }

  async schedule(queue: string, payload: Envelope, runAt: Date): Promise<PublishReceipt> {
    if (!(runAt instanceof Date) || Number.isNaN(runAt.getTime())) {
      throw new InvalidConfigError(`schedule(${JSON.stringify(queue)}): runAt must be a valid Date`);
    }
    const delayMs = Math.max(0, runAt.getTime() - this.#clock.now());
    if (Math.ceil(delayMs / 1000) > this.#horizonSeconds) {
      parseEnvelope(payload);
      throw new InvalidConfigError(
        `schedule(${JSON.stringify(queue)}): runAt ${runAt.toISOString()} is ${Math.ceil(delayMs / 1000)} s ahead, beyond the Vercel Queues horizon of ${this.#horizonSeconds} s (messages live at most ${VERCEL_MAX_RETENTION_SECONDS} s, and ${this.#config.retentionSeconds} s are kept for delivery and retries); schedule it later from a job or a cron instead`,
      );
    }
    return this.publish(queue, payload, { delayMs });
  }

  async #send(
    topic: string,
    body: Uint8Array,
    delaySeconds: number,
    idempotencyKey: string | undefined,
  ): Promise<PublishReceipt> {
    const { messageId } = await this.#client.send(topic, body, {
      retentionSeconds: delaySeconds + this.#config.retentionSeconds,
      ...(delaySeconds > 0 ? { delaySeconds } : {}),
      // Only a key the caller chose: one derived from the job_id would swallow replays.
      ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
    });
    return { messageId };
  }

  pushHandler(consumer: BoundConsumer): (request: Request) => Promise<Response> {
    const topic = this.#bindTopic(consumer);
    const replayTopic = toVercelReplayTopic(consumer.queue, consumer.name);
    const handle = this.#client.handleCallback<Uint8Array>(
      (payload, metadata) =>
        this.#process(consumer, metadata.topicName === replayTopic ? replayTopic : topic, payload, metadata),
      { visibilityTimeoutSeconds: this.#config.visibilityTimeoutSeconds, retry: directiveOf },
    );
    return async (request: Request) => {
      try {
        return await handle(request);
      } finally {
        // The function may be frozen or ended once it answers: the alerts of
        // the letters this request wrote go out (or are recorded) first.
        await this.#flushAlerts(consumer);
      }
    };
  }

  startWorker(consumer: BoundConsumer, options: VercelWorkerOptions = {}): VercelWorker {
    if (this.#closed) throw new QueueClosedError();
    const topic = this.#bindTopic(consumer);
    const group = toVercelTopic(consumer.name);
    const idleDelayMs = nonNegative(options.idleDelayMs ?? 1_000, "idleDelayMs");
    const errorDelayMs = nonNegative(options.errorDelayMs ?? 5_000, "errorDelayMs");
    const replayLanes = nonNegative(options.replayConcurrency ?? 1, "replayConcurrency");
    const live = new PollWorker(
      (lane) => this.#receiveOne(consumer, topic, group, lane),
      positiveInteger(options.concurrency ?? 4, "concurrency"),
      idleDelayMs,
      errorDelayMs,
      this.#logger,
      `${consumer.name} on ${consumer.queue}`,
    );
    const replayTopic = toVercelReplayTopic(consumer.queue, consumer.name);
    const replays =
      replayLanes > 0
        ? new PollWorker(
            (lane) => this.#receiveOne(consumer, replayTopic, group, lane),
            positiveInteger(replayLanes, "replayConcurrency"),
            idleDelayMs,
            errorDelayMs,
            this.#logger,
            `${consumer.name} replays on ${consumer.queue}`,
          )
        : undefined;
    const worker: VercelWorker & { done: Promise<void> } = {
      get inFlight() {
        return live.inFlight + (replays?.inFlight ?? 0);
      },
      done: Promise.all([live.done, replays?.done]).then(() => {}),
      async stop() {
        await Promise.all([live.stop(), replays?.stop()]);
      },
    };
    this.#workers.add(worker);
    void worker.done.finally(() => this.#workers.delete(worker));
    return worker;
  }

  async receiveAvailable(consumer: BoundConsumer, options: { readonly concurrency?: number } = {}): Promise<number> {
    const topic = this.#bindTopic(consumer);
    const group = toVercelTopic(consumer.name);
    const concurrency = positiveInteger(options.concurrency ?? 1, "concurrency");
    let delivered = 0;
    let failure: { error: unknown } | undefined;
    const lane = async (from: string) => {
      // Every lane stops at the first failure, so none keeps receiving after this call returned.
      while (!failure) {
        let outcome: "delivered" | "empty";
        try {
          outcome = await this.#receiveOne(consumer, from, group, 0);
        } catch (error) {
          // A delivery that is left unacknowledged still counts; the lease brings it back.
          if (!(error instanceof NotAcknowledged)) {
            failure ??= { error };
            return;
          }
          outcome = "delivered";
        }
        if (outcome === "empty") return;
        delivered += 1;
      }
    };
    await Promise.allSettled(Array.from({ length: concurrency }, () => lane(topic)));
    // Then the consumer's replays, one at a time: their own lane, after live traffic.
    if (!failure) await lane(toVercelReplayTopic(consumer.queue, consumer.name));
    // A one-shot caller (a cron function) may end once this resolves.
    await this.#flushAlerts(consumer);
    if (failure) throw failure.error;
    return delivered;
  }

  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.all([...this.#workers].map((w) => w.stop()));
  }

  /**
   * The consumer's dead-letter alerts delivered or recorded, waited for at
   * most `ALERT_FLUSH_TIMEOUT_MS` (a hung alert sink must not hold a function
   * until its time limit); never throws.
   */
  async #flushAlerts(consumer: BoundConsumer): Promise<void> {
    if (typeof consumer.flushAlerts !== "function") return;
    let timer: NodeJS.Timeout | undefined;
    try {
      const flushed = consumer.flushAlerts().then(() => true);
      const late = new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), ALERT_FLUSH_TIMEOUT_MS);
      });
      if (!(await Promise.race([flushed, late]))) {
        this.#logger.warn(`${consumer.name}: dead-letter alerts not flushed within ${ALERT_FLUSH_TIMEOUT_MS} ms`);
      }
    } catch (thrown) {
      this.#logger.warn(`${consumer.name}: dead-letter alerts not flushed: ${describeError(thrown)}`);
    } finally {
      clearTimeout(timer);
    }
  }

  #bindTopic(consumer: BoundConsumer): string {
    if (typeof consumer?.deliver !== "function") {
      throw new InvalidConfigError("the Vercel adapter takes a consumer from bindConsumer()");
    }
    const leaseMs = this.#config.visibilityTimeoutSeconds * 1000;
    if (consumer.timeoutMs !== undefined && !(consumer.timeoutMs < leaseMs)) {
      throw new InvalidConfigError(
        `consumer "${consumer.name}": its handler time bound (timeoutMs ${consumer.timeoutMs}) must be below the lease (visibilityTimeoutSeconds ${this.#config.visibilityTimeoutSeconds} s), or a run that timed out could still be going when its message is delivered again`,
      );
    }
    toVercelTopic(consumer.name);
    return toVercelTopic(consumer.queue);
  }

  async #receiveOne(
    consumer: BoundConsumer,
    topic: string,
    group: string,
    _lane: number,
  ): Promise<"delivered" | "empty"> {
    if (!this.#poller) this.#poller = new PollingQueueClient(this.#clientOptions());
    const result = await this.#poller.receive<Uint8Array>(
      topic,
      group,
      (payload, metadata) => this.#process(consumer, topic, payload, metadata),
      { limit: 1, visibilityTimeoutSeconds: this.#config.visibilityTimeoutSeconds, retry: directiveOf },
    );
    return result.ok ? "delivered" : "empty";
  }

  /**
   * One delivery, in the SDK's handler: returning acknowledges; throwing a
   * `Directive` makes the SDK apply it; throwing anything else leaves the
   * message to the service's redelivery.
   */
  async #process(consumer: BoundConsumer, topic: string, payload: unknown, metadata: MessageMetadata): Promise<void> {
    if (metadata.topicName !== topic) {
      // A trigger pointing at the wrong route: never acknowledge what nobody processed.
      const message = `route bound to ${consumer.queue} (topic ${topic}) got a message of topic ${metadata.topicName}; check vercel.json`;
      this.#logger.error(message);
      throw new NotAcknowledged(message);
    }
    const bytes = payload instanceof Uint8Array ? payload : Buffer.from(String(payload), "utf8");
    const deferral = readDeferral(bytes);
    // Another consumer's deferral: this consumer has its own copy of the original.
    if (deferral && deferral.consumer !== consumer.name) return;
    const body = deferral ? deferral.body : bytes;
    const deliveryCount = (deferral?.attemptsSpent ?? 0) + metadata.deliveryCount;
    const deferrals = deferral?.deferrals ?? 0;
    const dueAt = deferral?.dueAt ?? this.#dueAt(metadata);
    // The consumer's replay topic carries only replays for it (a deferral of
    // one is republished there, keeping the lane).
    const replayLane = topic === toVercelReplayTopic(consumer.queue, consumer.name);
    const replay = deferral?.replay === true || replayLane;
    const event = { queue: consumer.queue, consumer: consumer.name, messageId: metadata.messageId, deliveryCount };

    let result: DeliveryResult;
    try {
      result = await consumer.deliver({
        body,
        deliveryCount,
        messageId: metadata.messageId,
        dueAt,
        ...(deferral || replayLane ? { targetConsumer: consumer.name } : {}),
        ...(deferrals > 0 ? { deferrals } : {}),
        ...(replay ? { replay: true } : {}),
      });
    } catch (thrown) {
      const error = describeError(thrown);
      this.#emit({ ...event, result: { outcome: "thrown", error }, action: "none" });
      throw new NotAcknowledged(`deliver threw: ${error}`);
    }
    if (result.ack) {
      this.#emit({ ...event, result, action: "ack" });
      return;
    }
    if (result.outcome === "dead_letter_failed") {
      this.#emit({ ...event, result, action: "none" });
      throw new NotAcknowledged(result.error);
    }
    const afterSeconds =
      Number.isFinite(result.retryAfterMs) && result.retryAfterMs >= 0
        ? Math.max(1, Math.ceil(result.retryAfterMs / 1000))
        : this.#config.visibilityTimeoutSeconds;
    if (result.spendsAttempt && afterSeconds <= VERCEL_MAX_VISIBILITY_SECONDS) {
      this.#emit({ ...event, result, action: "visibility", afterSeconds });
      throw new Directive({ afterSeconds });
    }
    // A wait that must not count (rate limit, handler never started), or one
    // longer than a lease can be: republish with the attempts spent and the
    // deferrals so far, then acknowledge.
    const attemptsSpent = result.spendsAttempt ? deliveryCount : deliveryCount - 1;
    const deferralsSoFar = result.spendsAttempt ? deferrals : deferrals + 1;
    let delaySeconds = afterSeconds;
    if (delaySeconds > this.#horizonSeconds) {
      this.#logger.warn(
        `${consumer.name}: a wait of ${delaySeconds} s is beyond the Vercel Queues horizon; deferring ${this.#horizonSeconds} s`,
        { messageId: metadata.messageId },
      );
      delaySeconds = this.#horizonSeconds;
    }
    try {
      await this.#send(
        topic,
        encodeDeferral(consumer.name, attemptsSpent, body, { dueAt, replay, deferrals: deferralsSoFar }),
        delaySeconds,
        // Per consumer: every consumer group of the topic sees the same message id,
        // and a shared key would let the provider drop the second group's deferral.
        deferralKey(consumer.name, metadata.messageId, metadata.deliveryCount),
      );
    } catch (thrown) {
      // The message must not be lost: wait on the lease instead (this wait then
      // counts as an attempt, and the deferral is not counted in `deferrals`).
      const fallback = Math.min(afterSeconds, VERCEL_MAX_VISIBILITY_SECONDS);
      this.#logger.warn(
        `${consumer.name}: could not republish a deferral (${describeError(thrown)}); delaying the lease ${fallback} s instead`,
        { messageId: metadata.messageId },
      );
      this.#emit({ ...event, result, action: "visibility", afterSeconds: fallback });
      throw new Directive({ afterSeconds: fallback });
    }
    this.#emit({ ...event, result, action: "deferred", afterSeconds: delaySeconds });
    throw new Directive({ acknowledge: true });
  }

  /**
   * When a message became deliverable. The service reports only when it was
   * sent (`createdAt`) and when it expires; every send of this adapter asks for
   * a retention of its delay plus `retentionSeconds`, so the delay is what the
   * lifetime has beyond `retentionSeconds` (0 for a producer that sent no delay
   * and kept the default retention). A deferral carries its original's instead.
   * A due time well after now cannot be (the message is here): the lifetime was
   * not ours (another producer's retention, or the SDK's default when the
   * service sent none), so the send time is used.
   */
  #dueAt(metadata: MessageMetadata): number {
    const created = metadata.createdAt.getTime();
    const lifetimeMs = metadata.expiresAt.getTime() - created;
    const delayMs = Math.min(
      Math.max(0, lifetimeMs - this.#config.retentionSeconds * 1000),
      this.#horizonSeconds * 1000,
    );
    const due = created + delayMs;
    return Number.isFinite(due) && due <= this.#clock.now() + DUE_AT_SKEW_MS ? due : created;
  }

  #emit(event: VercelDeliveryEvent): void {
    for (const listener of this.#listeners) {
      // An observer's bug must not change what happens to the message.
      try {
        listener(event);
      } catch {}
    }
  }
}

class PollWorker implements VercelWorker {
  readonly done: Promise<void>;
  #inFlight = 0;
  #stopping = false;
  readonly #wakers = new Set<() => void>();

  constructor(
    receive: (lane: number) => Promise<"delivered" | "empty">,
    concurrency: number,
    idleDelayMs: number,
    errorDelayMs: number,
    logger: Logger,
    label: string,
  ) {
    const lane = async (n: number) => {
      while (!this.#stopping) {
        let wait = 0;
        this.#inFlight += 1;
        try {
          if ((await receive(n)) === "empty") wait = idleDelayMs;
        } catch (error) {
          if (!(error instanceof NotAcknowledged)) {
            // The service or the network failed: back off, the messages stay queued.
            logger.warn(`vercel worker ${label}: receive failed: ${describeError(error)}`);
            wait = errorDelayMs;
          }
        } finally {
          this.#inFlight -= 1;
        }
        if (wait > 0 && !this.#stopping) await this.#sleep(wait);
      }
    };
    this.done = Promise.all(Array.from({ length: concurrency }, (_, n) => lane(n))).then(() => {});
  }

  get inFlight(): number {
    return this.#inFlight;
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    for (const wake of this.#wakers) wake();
    await this.done;
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#wakers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.#wakers.add(wake);
    });
  }
}

/**
 * Creates the Vercel Queues adapter. Reads and checks its configuration now
 * (`InvalidConfigError` listing what is missing), so a module fails at start.
 */
export function createVercelQueue(options: VercelQueueOptions = {}): VercelQueue {
  return new VercelQueueAdapter(options);
}
