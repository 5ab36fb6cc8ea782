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
 */
import { createHash } from "node:crypto";
import { parseCallback, QueueClient, type Transport } from "@vercel/queue";
import { type Clock, systemClock } from "../../clock.ts";
import { type Envelope, parseEnvelope } from "../../envelope.ts";
import { describeError, InvalidConfigError, InvalidEnvelopeError, QueueClosedError } from "../../errors.ts";
import { consoleLogger, type Logger } from "../../ports/logger.ts";
import type { MetricsPort } from "../../ports/metrics.ts";
import {
  type BoundConsumer,
  checkDeliveryBound,
  type Delivery,
  type DeliveryResult,
  type PublishOptions,
  type PublishReceipt,
  type QueuePort,
  type ReplayLanePort,
} from "../../queue-port.ts";
import { timerDelay, withinMs } from "../../timers.ts";
import { nonNegative, positiveInteger } from "../../validate.ts";
import { MIN_WRAPPER_SECRET_LENGTH, WRAPPER_RESERVE_BYTES, WrapperCodec, type WrapperHead } from "./wrapper.ts";

export { readVercelWrapper, type VercelWrapper, WRAPPER_RESERVE_BYTES } from "./wrapper.ts";

/** Longest retention Vercel Queues documents (7 days; an earlier doc version said 24 h: configurable). */
export const VERCEL_MAX_RETENTION_SECONDS = 604_800;
/** Longest lease (visibility timeout) the SDK documents; a retry directive cannot wait longer. */
export const VERCEL_MAX_VISIBILITY_SECONDS = 3_600;
/** Largest message the service documents (100 MB). */
export const VERCEL_MAX_MESSAGE_BYTES = 100_000_000;
/** Deliveries a push trigger makes when `vercelTrigger` is not told otherwise (what `vercel dev` does). */
export const DEFAULT_MAX_DELIVERIES = 32;
/** Room kept in every message for the wrapper the adapter may put around it (a deferral, a replay, a hop). */
const MIN_RETENTION_SECONDS = 60;
const MIN_VISIBILITY_SECONDS = 30;
const MAX_IDEMPOTENCY_KEY = 256;
const DEFAULT_MAX_ATTEMPTS = 5;
/**
 * A redelivery must be due this long before the message expires, or the
 * adapter does not count on it: room for clock skew, a slow callback and the
 * service's own delay after a failed one.
 */
const EXPIRY_MARGIN_MS = 300_000;
const REGION_PATTERN = /^[a-z]{2,5}[0-9]{1,2}$/;
/** Longest a push request or `receiveAvailable` waits for its dead-letter alerts before it answers anyway. */
const ALERT_FLUSH_TIMEOUT_MS = 10_000;
/** Tries of an acknowledgement or a visibility change (network errors, 429 with a short Retry-After), as the SDK. */
const DIRECTIVE_TRIES = 3;
/** Longest Retry-After a directive waits for within one delivery. */
const DIRECTIVE_MAX_RETRY_AFTER_S = 5;

export interface VercelQueueOptions {
  /**
   * Vercel region of the queues. Poll workers must name it here (a fixed
   * region): a message can be consumed only in the region it was sent to, and
   * a function's VERCEL_REGION changes on failover. @default env VERCEL_REGION (set by Vercel in functions); required
   */
  readonly region?: string;
  /** API token. @default OIDC: env VERCEL_OIDC_TOKEN, or the per-request token on Vercel (VERCEL=1) */
  readonly token?: string;
  /** Deployment the sends are pinned to; `null` sends unpinned. @default env VERCEL_DEPLOYMENT_ID; required unless null */
  readonly deploymentId?: string | null;
  /** Where the API lives. @default the SDK's `https://{region}.vercel-queue.com` */
  readonly resolveBaseUrl?: (region: string) => URL;
  /**
   * The retention asked for every message: how long the service keeps it,
   * delay included. Set it to what the service accepts (7 days in the current
   * docs, 24 h in an earlier version). The fence TTL must cover it
   * (`transportHoldMs`). @default 604_800 (60..604800)
   */
  readonly retentionSeconds?: number;
  /**
   * The least time a message has between becoming due and expiring: the
   * longest single delay is `retentionSeconds` − this; a longer delay or
   * `schedule()` travels in hops. @default half the retention, at most 86_400
   */
  readonly deliveryWindowSeconds?: number;
  /** Largest message the service accepts; publish refuses an envelope that could not be wrapped within it. @default 100_000_000 */
  readonly maxMessageBytes?: number;
  /**
   * Longest the adapter waits for the service's answer to one of its own
   * republishes (a deferral, a hop, a rescue) before it takes the copy as
   * not stored and keeps the original (a copy stored after all is a
   * successor like any other). The SDK's send has no timeout of its own.
   * @default 10_000 (1_000..60_000)
   */
  readonly republishTimeoutMs?: number;
  /** Lease taken per delivery; renewed while the handler runs. @default 300 (30..3600) */
  readonly visibilityTimeoutSeconds?: number;
  /** How often a lease is renewed while the handler runs. @default as the SDK: min(60, max(10, visibility / 5)) s */
  readonly leaseRenewalMs?: number;
  /** For `schedule()`'s runAt − now and every lease and expiry decision. @default the system clock */
  readonly clock?: Clock;
  /** Where the configuration is read from. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** @default console */
  readonly logger?: Logger;
  /**
   * Called for every transport incident (a failed acknowledgement, a lease
   * renewal lost, an unconfirmed push callback, auth failures …): count them
   * as a metric, page on `alert: true`. Never throws into the adapter. @default none (they are logged)
   */
  readonly onIncident?: (incident: VercelIncident) => void;
  /** Counts every incident (`MetricsPort.transportIncident`, e.g. `createOtelMetrics()`). @default none */
  readonly metrics?: Pick<MetricsPort, "transportIncident">;
  /**
   * The secret that signs the wrappers the adapter sends (deferrals, hops,
   * rescues, delayed and addressed publishes): a wrapper says whom a job is
   * for and the attempts it spent, so one not signed with it is an ordinary
   * message (#19). At least 32 characters, the same in every deployment that
   * publishes to or consumes these queues; keep it with the other secrets.
   * @default env SOFTCRUM_QUEUE_SECRET; required
   */
  readonly wrapperSecret?: string;
  /**
   * Also read the unsigned wrappers of releases before #19: set it for the
   * deploy that introduces signing, until the old deferrals have drained (at
   * most `retentionSeconds`), then remove it — while it is set, a foreign
   * producer can forge a wrapper. @default false
   */
  readonly acceptUnsignedWrappers?: boolean;
}

export interface VercelWorkerOptions {
  /** Lanes, each receiving and running one message at a time. @default 4 */
  readonly concurrency?: number;
  /** Wait after an empty receive before asking again. @default 1_000 */
  readonly idleDelayMs?: number;
  /** Wait after a failed receive (network, 5xx, auth) before asking again. @default 5_000 */
  readonly errorDelayMs?: number;
  /**
   * Lanes receiving the consumer's replay topic (`toVercelReplayTopic`), apart
   * from `concurrency`: replays never take live lanes (SPEC §5). 0 starts
   * none (another worker or a route serves the replay topic). @default 1
   */
  readonly replayConcurrency?: number;
  /**
   * The consumer group's delivery cap, if the service applies one to poll
   * consumers (undocumented; `vercel dev` drops at 32). Must be at least
   * the consumer's `maxAttempts + 2`. @default DEFAULT_MAX_DELIVERIES
   */
  readonly maxDeliveries?: number;
  /** Consecutive auth failures (401, 403, no OIDC token) after which an incident with `alert: true` is raised. @default 3 */
  readonly authAlertAfter?: number;
  /**
   * Consecutive auth failures after which the worker fails: it stops
   * receiving, `health().state` is `failed` and `failed` resolves with the
   * error. Off Vercel an expired OIDC token is refreshed only by a linked
   * Vercel CLI, so retrying forever only hides the outage. @default 20
   */
  readonly maxAuthFailures?: number;
}

/** A poll worker's health, for a liveness probe. */
export interface VercelWorkerHealth {
  /** `degraded`: auth failures past `authAlertAfter`; `failed`: past `maxAuthFailures`, no longer receiving. */
  readonly state: "running" | "degraded" | "failed" | "stopped";
  readonly consecutiveAuthFailures: number;
  /** When a receive last succeeded (ms since the epoch), if ever. */
  readonly lastReceiveAt: number | undefined;
  readonly lastError: string | undefined;
}

export interface VercelWorker {
  /** Lanes busy receiving or delivering right now. */
  readonly inFlight: number;
  health(): VercelWorkerHealth;
  /** Resolves with the reason if the worker fails (auth failures past `maxAuthFailures`); never rejects. */
  readonly failed: Promise<Error>;
  /** Stops receiving and resolves when the deliveries in flight have finished (and been acknowledged or not). */
  stop(): Promise<void>;
}

/** Something went wrong between the adapter and the service that the job's own outcome does not show. */
export interface VercelIncident {
  readonly kind:
    | "ack_failed"
    | "visibility_failed"
    | "lease_renewal_failed"
    | "unconfirmed_callback"
    | "republish_failed"
    | "republish_unconfirmed"
    | "hold_unrecorded"
    | "rescued_before_drop"
    | "dead_lettered_before_drop"
    | "job_at_risk"
    | "auth_failed"
    | "worker_failed";
  readonly queue: string;
  readonly consumer: string;
  readonly messageId?: string;
  readonly message: string;
  /** True when someone should be paged: a job may be lost, or a worker is stalled. */
  readonly alert: boolean;
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
  /** False when the acknowledgement or visibility change failed (the message comes back when its lease ends). */
  readonly applied?: boolean;
}

/** What a route's vercel.json trigger says; the adapter must know it to stay ahead of its cap. */
export interface VercelRouteOptions {
  /** The trigger's `maxDeliveries`: the service drops the message after this many. @default DEFAULT_MAX_DELIVERIES */
  readonly maxDeliveries?: number;
  /** The trigger's `retryAfterSeconds`: the wait after a failed callback. @default 60 */
  readonly retryAfterSeconds?: number;
}

export interface VercelQueue extends QueuePort, ReplayLanePort {
  readonly region: string;
  /** How long the service may hold a message (its retention), for the fence cleanup's `transportHoldMs`. */
  readonly transportHoldMs: number;
  /**
   * A route handler (`export const POST = …`) delivering a vercel.json
   * trigger's messages to `consumer`: those of its queue's topic, and those of
   * its replay topic (`toVercelReplayTopic`) — give the replay topic its own
   * trigger (with its own concurrency) on the same route.
   */
  pushHandler(consumer: BoundConsumer, route?: VercelRouteOptions): (request: Request) => Promise<Response>;
  /** Starts a poll loop delivering `consumer`'s queue (consumer group = its mapped name) until `stop()`. */
  startWorker(consumer: BoundConsumer, options?: VercelWorkerOptions): VercelWorker;
  /** Receives until the queue reports empty, `concurrency` at a time (e.g. from a cron function). Returns the deliveries made. */
  receiveAvailable(
    consumer: BoundConsumer,
    options?: { readonly concurrency?: number; readonly maxDeliveries?: number },
  ): Promise<number>;
  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void;
  /** Incidents so far, by kind (also reported to `onIncident` and the logger). */
  incidentCounts(): Readonly<Record<string, number>>;
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
  /** True when the region came from options.region (a fixed region), not from VERCEL_REGION. */
  readonly regionFixed: boolean;
  readonly token: string | undefined;
  readonly deploymentId: string | null;
  readonly retentionSeconds: number;
  readonly deliveryWindowSeconds: number;
  readonly maxMessageBytes: number;
  readonly visibilityTimeoutSeconds: number;
  readonly leaseRenewalMs: number;
  readonly republishTimeoutMs: number;
  readonly wrapperSecret: string;
  readonly acceptUnsignedWrappers: boolean;
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
  const retentionSeconds = options.retentionSeconds ?? VERCEL_MAX_RETENTION_SECONDS;
  const retentionOk =
    Number.isInteger(retentionSeconds) &&
    retentionSeconds >= MIN_RETENTION_SECONDS &&
    retentionSeconds <= VERCEL_MAX_RETENTION_SECONDS;
  if (!retentionOk) {
    problems.push(
      `retentionSeconds: must be an integer in ${MIN_RETENTION_SECONDS}..${VERCEL_MAX_RETENTION_SECONDS} (what the service accepts), got ${retentionSeconds}`,
    );
  }
  const deliveryWindowSeconds =
    options.deliveryWindowSeconds ?? Math.min(86_400, Math.floor((retentionOk ? retentionSeconds : 86_400) / 2));
  if (
    !Number.isInteger(deliveryWindowSeconds) ||
    deliveryWindowSeconds < 30 ||
    (retentionOk && deliveryWindowSeconds > retentionSeconds - 30)
  ) {
    problems.push(
      `deliveryWindowSeconds: must be an integer from 30 to retentionSeconds − 30 (a message needs time to be delivered after its delay), got ${deliveryWindowSeconds}`,
    );
  }
  const maxMessageBytes = options.maxMessageBytes ?? VERCEL_MAX_MESSAGE_BYTES;
  if (
    !Number.isInteger(maxMessageBytes) ||
    maxMessageBytes < 4 * WRAPPER_RESERVE_BYTES ||
    maxMessageBytes > VERCEL_MAX_MESSAGE_BYTES
  ) {
    problems.push(
      `maxMessageBytes: must be an integer in ${4 * WRAPPER_RESERVE_BYTES}..${VERCEL_MAX_MESSAGE_BYTES}, got ${maxMessageBytes}`,
    );
  }
  const visibilityTimeoutSeconds = options.visibilityTimeoutSeconds ?? 300;
  const visibilityOk =
    Number.isInteger(visibilityTimeoutSeconds) &&
    visibilityTimeoutSeconds >= MIN_VISIBILITY_SECONDS &&
    visibilityTimeoutSeconds <= VERCEL_MAX_VISIBILITY_SECONDS;
  if (!visibilityOk) {
    problems.push(
      `visibilityTimeoutSeconds: must be an integer in ${MIN_VISIBILITY_SECONDS}..${VERCEL_MAX_VISIBILITY_SECONDS}, got ${visibilityTimeoutSeconds}`,
    );
  }
  const defaultRenewalMs = Math.min(60, Math.max(10, (visibilityOk ? visibilityTimeoutSeconds : 300) / 5)) * 1000;
  const leaseRenewalMs = options.leaseRenewalMs ?? defaultRenewalMs;
  if (!Number.isFinite(leaseRenewalMs) || leaseRenewalMs <= 0 || leaseRenewalMs > defaultRenewalMs) {
    problems.push(
      `leaseRenewalMs: must be above 0 and at most ${defaultRenewalMs} (a renewal must come well before the lease ends), got ${leaseRenewalMs}`,
    );
  }
  const republishTimeoutMs = options.republishTimeoutMs ?? 10_000;
  if (!Number.isInteger(republishTimeoutMs) || republishTimeoutMs < 1_000 || republishTimeoutMs > 60_000) {
    problems.push(
      `republishTimeoutMs: must be an integer from 1000 to 60000 (a republish waits inside a delivery), got ${republishTimeoutMs}`,
    );
  }
  const wrapperSecret = options.wrapperSecret ?? env["SOFTCRUM_QUEUE_SECRET"] ?? "";
  if (typeof wrapperSecret !== "string" || wrapperSecret.length < MIN_WRAPPER_SECRET_LENGTH) {
    problems.push(
      `wrapperSecret: pass options.wrapperSecret or set SOFTCRUM_QUEUE_SECRET, at least ${MIN_WRAPPER_SECRET_LENGTH} characters (e.g. \`openssl rand -base64 32\`), the same in every deployment that uses these queues: it signs the wrappers of deferred and addressed jobs`,
    );
  }
  if (problems.length > 0) {
    throw new InvalidConfigError(`Vercel Queues adapter is not configured:\n- ${problems.join("\n- ")}`);
  }
  return {
    region: region as string,
    regionFixed: options.region !== undefined,
    token,
    deploymentId,
    retentionSeconds,
    deliveryWindowSeconds,
    maxMessageBytes,
    visibilityTimeoutSeconds,
    leaseRenewalMs,
    republishTimeoutMs,
    wrapperSecret,
    acceptUnsignedWrappers: options.acceptUnsignedWrappers === true,
  };
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

function byteLength(body: string | Uint8Array): number {
  return typeof body === "string" ? Buffer.byteLength(body, "utf8") : body.byteLength;
}

const sha256 = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");

/**
 * The provider idempotency key of a republish: one per consumer and delivery
 * of one message, so a route retried after a lost response does not make two.
 * Message ids are opaque and their uniqueness across deployment partitions
 * is undocumented, while a duplicate key is "silently dropped out-of-band"
 * (after which the original is acknowledged: a lost job), so the key also
 * binds the topic, the deployment, the send time and the bytes.
 */
function republishKey(parts: {
  readonly consumer: string;
  readonly topic: string;
  readonly deploymentId: string | null;
  readonly createdAt: number;
  readonly messageId: string;
  readonly deliveryCount: number;
  readonly body: Uint8Array;
}): string {
  const identity = JSON.stringify([
    parts.consumer,
    parts.topic,
    parts.deploymentId,
    parts.createdAt,
    parts.messageId,
    parts.deliveryCount,
    sha256(parts.body),
  ]);
  return `softcrum-deferral:${sha256(identity)}`;
}

/**
 * A message's name in the transport-hold store (`BoundConsumer.holds`): its
 * identity on the service — topic, id and send time, since ids are opaque
 * and their uniqueness across partitions is undocumented.
 */
function messageKey(topic: string, message: { readonly messageId: string; readonly createdAt: Date }): string {
  return sha256(JSON.stringify([topic, message.messageId, message.createdAt.getTime()]));
}

/** What the service answered, read by name (the SDK's error classes may be loaded twice). */
function errorName(error: unknown): string {
  return error instanceof Error ? error.name : "";
}

const leaseGone = (error: unknown) =>
  errorName(error) === "MessageNotFoundError" || errorName(error) === "MessageNotAvailableError";

const authFailure = (error: unknown) =>
  errorName(error) === "UnauthorizedError" ||
  errorName(error) === "ForbiddenError" ||
  (error instanceof Error && /OIDC token/i.test(error.message));

// ---------------------------------------------------------------------------
// The SDK's API client

/** A received message as the SDK's API client returns it. */
interface QueueMessage {
  readonly messageId: string;
  readonly deliveryCount: number;
  readonly createdAt: Date;
  readonly expiresAt?: Date | undefined;
  readonly receiptHandle: string;
  readonly payload: Uint8Array;
}

interface LeaseRef {
  readonly queueName: string;
  readonly consumerGroup: string;
  readonly receiptHandle: string;
}

/**
 * The part of the SDK's `ApiClient` the adapter drives: the same requests,
 * auth (token or OIDC), region routing and deployment header as the SDK's
 * own consumers, without their lifecycle.
 */
interface LeaseApi {
  withRegion(region: string): LeaseApi;
  receiveMessages(options: {
    queueName: string;
    consumerGroup: string;
    visibilityTimeoutSeconds: number;
    limit: number;
    cursorFallback: "earliest" | "latest";
  }): AsyncIterable<QueueMessage>;
  receiveMessageById(options: {
    queueName: string;
    consumerGroup: string;
    messageId: string;
    visibilityTimeoutSeconds: number;
  }): Promise<{ message: QueueMessage }>;
  acknowledgeMessage(options: LeaseRef): Promise<unknown>;
  changeVisibility(options: LeaseRef & { visibilityTimeoutSeconds: number }): Promise<unknown>;
}

/**
 * The SDK keeps each client's `ApiClient` under this global symbol (so that
 * two bundled copies of the SDK still find it). `@vercel/queue` is pinned
 * exactly (0.6.0); a version without it fails here, at start, not on a message.
 */
const API_CLIENT = Symbol.for("@vercel/queue.apiClient");

function leaseApiOf(client: QueueClient): LeaseApi {
  const api = (client as unknown as Record<symbol, unknown>)[API_CLIENT] as Partial<LeaseApi> | undefined;
  const methods = [
    "withRegion",
    "receiveMessages",
    "receiveMessageById",
    "acknowledgeMessage",
    "changeVisibility",
  ] as const;
  if (!api || methods.some((m) => typeof api[m] !== "function")) {
    throw new InvalidConfigError(
      "this @vercel/queue does not expose its API client (Symbol.for('@vercel/queue.apiClient')) with receiveMessages, receiveMessageById, acknowledgeMessage, changeVisibility and withRegion; the adapter is written for @vercel/queue 0.6.0",
    );
  }
  return api as LeaseApi;
}

// ---------------------------------------------------------------------------
// The adapter

/** Thrown from a poll delivery that must not be acknowledged: the service redelivers it. */
class NotAcknowledged extends Error {
  override readonly name = "NotAcknowledged";
}

/** One consumer bound to one delivery mode: what its deliveries need to know. */
interface Lane {
  readonly consumer: BoundConsumer;
  /** The topic this lane receives: the queue's, or the consumer's replay topic. */
  readonly topic: string;
  /** The consumer's replay topic: what arrives there is a replay for it (#10 item 3). */
  readonly replayTopic: string;
  /** Poll: the consumer's mapped name; push: the group the callback names. */
  readonly group: string;
  readonly api: LeaseApi;
  readonly mode: "push" | "poll";
  /** The service drops the message after this many deliveries. */
  readonly maxDeliveries: number;
  /** When an unacknowledged delivery comes back: push, the trigger's retryAfterSeconds; poll, the lease. */
  readonly redeliverySeconds: number;
}

type Outcome = "done" | "skipped" | "not_acknowledged" | "directive_failed";

/** What a delivery ends with on the service. */
type Action =
  | { readonly kind: "ack"; readonly event?: "ack" | "deferred"; readonly afterSeconds?: number }
  | { readonly kind: "visibility"; readonly seconds: number }
  | { readonly kind: "none" };

interface Processed {
  readonly action: Action;
  /** What to report to `onDelivery` listeners (nothing for a message addressed to another consumer or a hop). */
  readonly event?: Omit<VercelDeliveryEvent, "action" | "afterSeconds" | "applied">;
}

class VercelQueueAdapter implements VercelQueue {
  readonly region: string;
  readonly #config: VercelQueueConfig;
  readonly #client: QueueClient;
  readonly #api: LeaseApi;
  readonly #wrappers: WrapperCodec;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #onIncident: ((incident: VercelIncident) => void) | undefined;
  readonly #metrics: Pick<MetricsPort, "transportIncident"> | undefined;
  readonly #listeners = new Set<(event: VercelDeliveryEvent) => void>();
  readonly #workers = new Set<PollWorker | CombinedWorker>();
  readonly #incidents = new Map<string, number>();
  #closed = false;

  constructor(options: VercelQueueOptions) {
    this.#config = resolveVercelQueueConfig(options);
    this.region = this.#config.region;
    this.#clock = options.clock ?? systemClock;
    this.#logger = options.logger ?? consoleLogger;
    this.#onIncident = options.onIncident;
    this.#metrics = options.metrics;
    this.#client = new QueueClient({
      region: this.#config.region,
      deploymentId: this.#config.deploymentId,
      transport: rawTransport as Transport,
      ...(this.#config.token !== undefined ? { token: this.#config.token } : {}),
      ...(options.resolveBaseUrl ? { resolveBaseUrl: options.resolveBaseUrl } : {}),
    });
    this.#api = leaseApiOf(this.#client);
    this.#wrappers = new WrapperCodec(this.#config.wrapperSecret, {
      acceptUnsigned: this.#config.acceptUnsignedWrappers,
    });
  }

  get transportHoldMs(): number {
    return this.#config.retentionSeconds * 1000;
  }

  /** Longest delay one message can carry: its retention less the window it needs to be delivered. */
  get #maxDelaySeconds(): number {
    return this.#config.retentionSeconds - this.#config.deliveryWindowSeconds;
  }

  /** Largest job (envelope or foreign body) this transport can still wrap for a deferral, a hop or a replay. */
  get #maxBodyBytes(): number {
    return this.#config.maxMessageBytes - WRAPPER_RESERVE_BYTES;
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
    if (size > this.#maxBodyBytes) {
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
    if (target === undefined && delaySeconds === 0) return this.#send(topic, Buffer.from(json, "utf8"), 0, key);
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
    if (bytes.byteLength > this.#maxBodyBytes) {
      throw new InvalidEnvelopeError([
        `the payload is ${bytes.byteLength} bytes; Vercel Queues carries at most ${this.#config.maxMessageBytes} bytes per message, less ${WRAPPER_RESERVE_BYTES} kept for the adapter's wrapper (deferrals)`,
      ]);
    }
    return this.#send(topic, bytes, 0, undefined);
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
    const hop = delaySeconds > this.#maxDelaySeconds;
    const wrapped = this.#wrappers.encode(
      hop ? { ...head, notBefore: this.#clock.now() + delaySeconds * 1000 } : head,
      body,
    );
    return this.#send(topic, wrapped, hop ? this.#maxDelaySeconds : delaySeconds, idempotencyKey);
  }

  async #send(
    topic: string,
    body: Uint8Array,
    delaySeconds: number,
    idempotencyKey: string | undefined,
  ): Promise<PublishReceipt> {
    if (body.byteLength > this.#config.maxMessageBytes) {
      throw new InvalidEnvelopeError([
        `a message of ${body.byteLength} bytes is beyond the ${this.#config.maxMessageBytes} bytes Vercel Queues carries`,
      ]);
    }
    const { messageId } = await this.#client.send(topic, body, {
      // Always the longest retention: a route or database outage shorter than
      // it loses nothing; the delay is counted within it.
      retentionSeconds: this.#config.retentionSeconds,
      ...(delaySeconds > 0 ? { delaySeconds } : {}),
      // Only a key the caller chose: one derived from the job_id would swallow replays.
      ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
    });
    // 201 answers the id; 202 ("accepted for deferred processing") none: not known stored.
    return { messageId, stored: messageId !== null };
  }

  pushHandler(consumer: BoundConsumer, route: VercelRouteOptions = {}): (request: Request) => Promise<Response> {
    const retryAfterSeconds = positiveInteger(route.retryAfterSeconds ?? 60, "retryAfterSeconds");
    const lane = this.#bindLane(consumer, "push", route.maxDeliveries, retryAfterSeconds);
    return async (request: Request) => {
      try {
        return await this.#handlePush(lane, request);
      } finally {
        // The function may be frozen or ended once it answers: the alerts of
        // the letters this request wrote go out (or are recorded) first.
        await this.#flushAlerts(consumer);
      }
    };
  }

  async #handlePush(bound: Lane, request: Request): Promise<Response> {
    let callback: Awaited<ReturnType<typeof parseCallback>>;
    try {
      callback = await parseCallback(request);
    } catch (error) {
      return Response.json({ error: describeError(error) }, { status: 400 });
    }
    if (callback.queueName !== bound.topic && callback.queueName !== bound.replayTopic) {
      // A trigger pointing at the wrong route: never acknowledge what nobody processed.
      const message = `route bound to ${bound.consumer.queue} (topic ${bound.topic}) got a message of topic ${callback.queueName}; check vercel.json`;
      this.#logger.error(message);
      return Response.json({ error: message }, { status: 500 });
    }
    // Follow-up calls go to the region the message lives in.
    const api = callback.region ? bound.api.withRegion(callback.region) : bound.api;
    const lane: Lane = { ...bound, api, topic: callback.queueName, group: callback.consumerGroup };
    let outcome: Outcome;
    try {
      if ("receiptHandle" in callback) {
        // Inline: the body came with the callback. Nothing authenticates the
        // request, so the handler runs only once the service confirms the
        // lease (`#consume` with confirm).
        if (!callback.rawBody) return Response.json({ error: "callback without a body" }, { status: 400 });
        const payload = await rawTransport.deserialize(callback.rawBody);
        const message: QueueMessage = {
          messageId: callback.messageId,
          deliveryCount: callback.deliveryCount ?? 1,
          createdAt: callback.createdAt ? new Date(callback.createdAt) : new Date(this.#clock.now()),
          expiresAt: callback.expiresAt ? new Date(callback.expiresAt) : undefined,
          receiptHandle: callback.receiptHandle,
          payload,
        };
        outcome = await this.#consume(lane, message, true);
      } else {
        // Routing only: the message (and its lease) come from the service itself.
        let received: { message: QueueMessage };
        try {
          received = await api.receiveMessageById({
            queueName: lane.topic,
            consumerGroup: lane.group,
            messageId: callback.messageId,
            visibilityTimeoutSeconds: this.#config.visibilityTimeoutSeconds,
          });
        } catch (error) {
          const name = errorName(error);
          if (name === "MessageNotAvailableError" || name === "MessageAlreadyProcessedError") {
            return Response.json({ status: "skipped", reason: name });
          }
          throw error;
        }
        outcome = await this.#consume(lane, received.message, false);
      }
    } catch (error) {
      this.#logger.error(`${bound.consumer.name}: push delivery failed: ${describeError(error)}`);
      return Response.json({ error: "Failed to process queue message" }, { status: 500 });
    }
    if (outcome === "done") return Response.json({ status: "success" });
    if (outcome === "skipped") return Response.json({ status: "skipped" });
    // Not acknowledged, or the directive failed: a 500 shows in the platform's
    // logs, and the service redelivers after the trigger's retryAfterSeconds.
    return Response.json({ error: outcome }, { status: 500 });
  }

  startWorker(consumer: BoundConsumer, options: VercelWorkerOptions = {}): VercelWorker {
    if (this.#closed) throw new QueueClosedError();
    const lane = this.#bindLane(consumer, "poll", options.maxDeliveries);
    const settings = {
      idleDelayMs: nonNegative(options.idleDelayMs ?? 1_000, "idleDelayMs"),
      errorDelayMs: nonNegative(options.errorDelayMs ?? 5_000, "errorDelayMs"),
      authAlertAfter: positiveInteger(options.authAlertAfter ?? 3, "authAlertAfter"),
      maxAuthFailures: positiveInteger(options.maxAuthFailures ?? 20, "maxAuthFailures"),
    };
    const replayLanes = nonNegative(options.replayConcurrency ?? 1, "replayConcurrency");
    const poll = (from: Lane, concurrency: number, label: string) =>
      new PollWorker(
        () => this.#receiveOne(from),
        { ...settings, concurrency },
        this.#clock,
        (kind, message, alert) =>
          this.#incident({ kind, queue: consumer.queue, consumer: consumer.name, message, alert }),
        this.#logger,
        label,
      );
    const live = poll(
      lane,
      positiveInteger(options.concurrency ?? 4, "concurrency"),
      `${consumer.name} on ${consumer.queue}`,
    );
    // Replays on lanes of their own: they never take a live lane (SPEC §5).
    const replays =
      replayLanes > 0
        ? poll(
            { ...lane, topic: lane.replayTopic },
            positiveInteger(replayLanes, "replayConcurrency"),
            `${consumer.name} replays on ${consumer.queue}`,
          )
        : undefined;
    const worker = replays ? new CombinedWorker([live, replays]) : live;
    this.#workers.add(worker);
    void worker.done.finally(() => this.#workers.delete(worker));
    return worker;
  }

  async receiveAvailable(
    consumer: BoundConsumer,
    options: { readonly concurrency?: number; readonly maxDeliveries?: number } = {},
  ): Promise<number> {
    const lane = this.#bindLane(consumer, "poll", options.maxDeliveries);
    const concurrency = positiveInteger(options.concurrency ?? 1, "concurrency");
    let delivered = 0;
    let failure: { error: unknown } | undefined;
    const run = async (from: Lane) => {
      // Every lane stops at the first failure, so none keeps receiving after this call returned.
      while (!failure) {
        let outcome: "delivered" | "empty";
        try {
          outcome = await this.#receiveOne(from);
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
    await Promise.allSettled(Array.from({ length: concurrency }, () => run(lane)));
    // Then the consumer's replays, one at a time: their own lane, after live traffic.
    if (!failure) await run({ ...lane, topic: lane.replayTopic });
    // A one-shot caller (a cron function) may end once this resolves.
    await this.#flushAlerts(consumer);
    if (failure) throw failure.error;
    return delivered;
  }

  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  incidentCounts(): Readonly<Record<string, number>> {
    return Object.fromEntries(this.#incidents);
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

  /** Checks a consumer against this transport where it is bound, so a configuration that could lose jobs fails at start. */
  #bindLane(
    consumer: BoundConsumer,
    mode: "push" | "poll",
    maxDeliveries: number | undefined,
    retryAfterSeconds?: number,
  ): Lane {
    if (typeof consumer?.deliver !== "function") {
      throw new InvalidConfigError("the Vercel adapter takes a consumer from bindConsumer()");
    }
    const leaseMs = this.#config.visibilityTimeoutSeconds * 1000;
    checkDeliveryBound(
      consumer,
      leaseMs,
      `the lease (visibilityTimeoutSeconds ${this.#config.visibilityTimeoutSeconds} s)`,
    );
    const group = toVercelTopic(consumer.name);
    const topic = toVercelTopic(consumer.queue);
    const cap = positiveInteger(maxDeliveries ?? DEFAULT_MAX_DELIVERIES, "maxDeliveries");
    const maxAttempts = consumer.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    if (cap < maxAttempts + 2) {
      throw new InvalidConfigError(
        `consumer "${consumer.name}": maxDeliveries ${cap} is below its maxAttempts + 2 (${maxAttempts + 2}); Vercel Queues drops a message after maxDeliveries with no dead-letter queue, so the harness needs its ${maxAttempts} attempts, the delivery past them that writes the dead letter, and one more for a letter that could not be written`,
      );
    }
    if (mode === "poll") {
      const problems: string[] = [];
      if (!this.#config.regionFixed) {
        problems.push(
          `it needs a fixed region (options.region), not VERCEL_REGION (${this.#config.region}): a message can be consumed only in the region it was sent to, and a function's region changes on failover`,
        );
      }
      if (this.#config.deploymentId !== null) {
        problems.push(
          `it must consume unpinned (deploymentId: null), not as deployment ${this.#config.deploymentId}: pinned, it would see only that deployment's messages and strand every other deployment's`,
        );
      }
      if (problems.length > 0) {
        throw new InvalidConfigError(`poll worker for consumer "${consumer.name}": ${problems.join("; ")}`);
      }
    }
    return {
      consumer,
      topic,
      replayTopic: toVercelReplayTopic(consumer.queue, consumer.name),
      group,
      api: this.#api,
      mode,
      maxDeliveries: cap,
      redeliverySeconds: mode === "push" ? (retryAfterSeconds ?? 60) : this.#config.visibilityTimeoutSeconds,
    };
  }

  async #receiveOne(lane: Lane): Promise<"delivered" | "empty"> {
    let received = 0;
    let notAcknowledged = false;
    // One message per request (`limit: 1`): a received batch would wait leased
    // while the first runs. Read to the end, so the response is consumed.
    for await (const message of lane.api.receiveMessages({
      queueName: lane.topic,
      consumerGroup: lane.group,
      visibilityTimeoutSeconds: this.#config.visibilityTimeoutSeconds,
      limit: 1,
      // A new consumer group starts at the oldest retained message, whatever the server's default.
      cursorFallback: "earliest",
    })) {
      received += 1;
      const outcome = await this.#consume(lane, message, false);
      if (outcome === "not_acknowledged") notAcknowledged = true;
    }
    if (notAcknowledged) throw new NotAcknowledged("left to the service's redelivery");
    return received > 0 ? "delivered" : "empty";
  }

  /**
   * One leased message, start to end: confirm the lease (a push callback),
   * renew it while the consumer runs, wait for a renewal still in flight (so
   * it cannot land after the directive and undo it), apply the directive, and
   * report a directive that failed.
   */
  async #consume(lane: Lane, message: QueueMessage, confirm: boolean): Promise<Outcome> {
    const expiresAt = this.#expiresAt(message);
    const ref: LeaseRef = { queueName: lane.topic, consumerGroup: lane.group, receiptHandle: message.receiptHandle };
    const incident = (kind: VercelIncident["kind"], text: string, alert = false) =>
      this.#incident({
        kind,
        queue: lane.consumer.queue,
        consumer: lane.consumer.name,
        messageId: message.messageId,
        message: text,
        alert,
      });
    /** A lease of `seconds`, never past the message's expiry (the service refuses that). */
    const leaseFor = (seconds: number) =>
      Math.max(0, Math.min(seconds, Math.floor((expiresAt - this.#clock.now()) / 1000)));
    const vt = this.#config.visibilityTimeoutSeconds;

    if (confirm) {
      // Proof that the service leased this message to this consumer group
      // under this handle (and the lease the route works under, instead of
      // the server's short first one): a forged or stale callback gets 404/409.
      try {
        await lane.api.changeVisibility({ ...ref, visibilityTimeoutSeconds: leaseFor(vt) });
      } catch (error) {
        if (leaseGone(error) || errorName(error) === "BadRequestError") {
          incident(
            "unconfirmed_callback",
            `push callback for message ${message.messageId} not confirmed by the service (${describeError(error)}); the handler did not run`,
          );
          return "skipped";
        }
        throw error;
      }
    }

    let stopped = false;
    let timer: NodeJS.Timeout | undefined;
    let renewal: Promise<void> | undefined;
    const renew = () => {
      timer = undefined;
      if (stopped) return;
      renewal = (async () => {
        try {
          const seconds = leaseFor(vt);
          if (seconds > 0) await lane.api.changeVisibility({ ...ref, visibilityTimeoutSeconds: seconds });
          if (!stopped) timer = setTimeout(renew, this.#config.leaseRenewalMs).unref();
        } catch (error) {
          incident("lease_renewal_failed", `lease renewal failed: ${describeError(error)}`);
          // A lease that is gone stays gone; anything else is tried again soon.
          if (!leaseGone(error) && !stopped) {
            timer = setTimeout(renew, Math.min(3_000, this.#config.leaseRenewalMs)).unref();
          }
        }
      })();
    };
    // Unref'd like the core's other timers: the delivery itself keeps the process busy.
    timer = setTimeout(renew, this.#config.leaseRenewalMs).unref();
    let processed: Processed;
    try {
      processed = await this.#process(lane, message, expiresAt);
    } catch (error) {
      processed = { action: { kind: "none" } };
      this.#logger.error(`${lane.consumer.name}: delivery failed: ${describeError(error)}`, {
        messageId: message.messageId,
      });
    } finally {
      stopped = true;
      clearTimeout(timer);
      // A renewal already sent must finish before the directive, or it could
      // land after it and move the lease back to the full visibility timeout.
      await renewal;
    }

    const { action } = processed;
    const emit = (applied: boolean) => {
      if (!processed.event) return;
      if (action.kind === "ack") {
        this.#emit({
          ...processed.event,
          action: action.event ?? "ack",
          ...(action.afterSeconds !== undefined ? { afterSeconds: action.afterSeconds } : {}),
          applied,
        });
      } else if (action.kind === "visibility") {
        this.#emit({ ...processed.event, action: "visibility", afterSeconds: action.seconds, applied });
      } else this.#emit({ ...processed.event, action: "none", applied });
    };
    if (action.kind === "none") {
      if (lane.mode === "push") {
        // The route answers 500; whether the service then waits the trigger's
        // retryAfterSeconds or the lease (which the confirmation lengthened) is
        // undocumented: end the lease then, so both answers agree. Best effort.
        await lane.api
          .changeVisibility({ ...ref, visibilityTimeoutSeconds: leaseFor(lane.redeliverySeconds) })
          .catch(() => {});
      }
      emit(true);
      return "not_acknowledged";
    }
    try {
      await this.#directive(() =>
        action.kind === "ack"
          ? lane.api.acknowledgeMessage(ref)
          : lane.api.changeVisibility({ ...ref, visibilityTimeoutSeconds: action.seconds }),
      );
    } catch (error) {
      // The message comes back when its lease ends (an acknowledged job as a
      // duplicate the fence absorbs; a retry possibly earlier than its backoff).
      const what = action.kind === "ack" ? "ack_failed" : "visibility_failed";
      incident(
        what,
        `${action.kind === "ack" ? "acknowledgement" : `visibility change of ${action.seconds} s`} failed: ${describeError(error)}; the message comes back when its lease ends`,
      );
      emit(false);
      return "directive_failed";
    }
    emit(true);
    return "done";
  }

  /** Applies an acknowledgement or visibility change, trying again on network errors and a short 429. */
  async #directive(call: () => Promise<unknown>): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await call();
        return;
      } catch (error) {
        if (attempt >= DIRECTIVE_TRIES) throw error;
        const retryAfter = (error as { retryAfter?: unknown }).retryAfter;
        if (errorName(error) === "TooManyRequestsError") {
          if (typeof retryAfter !== "number" || retryAfter > DIRECTIVE_MAX_RETRY_AFTER_S) throw error;
          await new Promise((r) => setTimeout(r, retryAfter * 1000));
        } else if (error instanceof TypeError) {
          await new Promise((r) => setTimeout(r, 250 * attempt));
        } else throw error;
      }
    }
  }

  /** When the service drops the message; the SDK's own assumption (a day after the send) when it says nothing. */
  #expiresAt(message: QueueMessage): number {
    const reported = message.expiresAt?.getTime();
    return reported !== undefined && Number.isFinite(reported) ? reported : message.createdAt.getTime() + 86_400_000;
  }

  /**
   * One delivery: unwrap, hand it to the harness, and decide what the service
   * must do so that the message comes back when the harness asks — or, when
   * the service would drop it first (its delivery cap or its retention), so
   * that a fresh copy carries it on, or its dead letter is written now.
   */
  async #process(lane: Lane, message: QueueMessage, expiresAt: number): Promise<Processed> {
    const { consumer } = lane;
    const bytes = message.payload;
    const wrapper = this.#wrappers.read(bytes);
    // Another consumer's copy (a deferral, a replay): this consumer has its own.
    if (wrapper?.consumer !== undefined && wrapper.consumer !== consumer.name) return { action: { kind: "ack" } };
    const body = wrapper ? wrapper.body : bytes;
    const now = this.#clock.now();
    const attemptsBefore = wrapper?.attemptsSpent ?? 0;
    const deferrals = wrapper?.deferrals ?? 0;
    // The consumer's replay topic carries only replays for it (a deferral of
    // one is republished there, keeping the lane).
    const replayLane = lane.topic === lane.replayTopic;
    const replay = wrapper?.replay === true || replayLane;
    const dueAt = wrapper?.dueAt ?? message.createdAt.getTime();
    const carried: WrapperHead = {
      consumer: consumer.name,
      attemptsSpent: attemptsBefore,
      deferrals,
      dueAt,
      ...(replay ? { replay: true } : {}),
    };
    const last = message.deliveryCount >= lane.maxDeliveries;
    const fitsBefore = (waitSeconds: number) =>
      !last && this.#clock.now() + waitSeconds * 1000 + EXPIRY_MARGIN_MS <= expiresAt;
    const key = messageKey(lane.topic, message);
    // A copy republished from a delivery that was kept: its predecessor may go.
    if (wrapper?.origin !== undefined) await this.#successorArrived(lane, message, wrapper.origin);
    // Deliveries of this message the adapter kept without spending an attempt
    // (the service counts every lease): they are not attempts (#19).
    const kept = message.deliveryCount > 1 ? await this.#keptBefore(lane, message, key) : undefined;
    // It was kept for a successor that has arrived since: the job lives on in that copy.
    if (kept?.succeeded) return { action: { kind: "ack" } };

    // A hop: came due before its time (a wait longer than one message holds).
    if (wrapper?.notBefore !== undefined && wrapper.notBefore > now + 1_000) {
      const remaining = Math.ceil((wrapper.notBefore - now) / 1000);
      try {
        const stored = await this.#republish(lane, message, carried, body, remaining, wrapper.notBefore);
        if (stored === "stored") return { action: { kind: "ack" } };
        // 202: the next hop is not known to be stored, so this one is kept:
        // it waits on its lease and hops again (a copy stored after all is a
        // duplicate the fence absorbs).
        const seconds = Math.min(remaining, VERCEL_MAX_VISIBILITY_SECONDS);
        this.#incident({
          kind: "republish_unconfirmed",
          queue: consumer.queue,
          consumer: consumer.name,
          messageId: message.messageId,
          message: `the service accepted the next hop of a message due in ${remaining} s without storing it yet (202); ${fitsBefore(seconds) ? `the message is kept and hops again in ${seconds} s` : "the message is left to the service"}`,
          alert: false,
        });
        return {
          action: await this.#keep(
            lane,
            message,
            key,
            fitsBefore(seconds) ? { kind: "visibility", seconds } : { kind: "none" },
          ),
        };
      } catch (error) {
        const seconds = Math.min(remaining, VERCEL_MAX_VISIBILITY_SECONDS);
        this.#incident({
          kind: "republish_failed",
          queue: consumer.queue,
          consumer: consumer.name,
          messageId: message.messageId,
          message: `could not republish a message due in ${remaining} s (${describeError(error)}); ${fitsBefore(seconds) ? `it waits ${seconds} s on its lease` : "it is left to the service"}`,
          alert: false,
        });
        return {
          action: await this.#keep(
            lane,
            message,
            key,
            fitsBefore(seconds) ? { kind: "visibility", seconds } : { kind: "none" },
          ),
        };
      }
    }

    const deliveryCount = attemptsBefore + Math.max(1, message.deliveryCount - (kept?.holds ?? 0));
    const delivery: Delivery = {
      body,
      deliveryCount,
      messageId: message.messageId,
      dueAt,
      ...(wrapper?.consumer !== undefined || replayLane ? { targetConsumer: consumer.name } : {}),
      ...(deferrals > 0 ? { deferrals } : {}),
      ...(replay ? { replay: true } : {}),
    };
    const event = { queue: consumer.queue, consumer: consumer.name, messageId: message.messageId, deliveryCount };

    // A body this transport could not wrap could never be deferred or
    // replayed: poison, as publish refuses it (another producer sent it).
    const size = byteLength(body);
    if (size > this.#maxBodyBytes && typeof consumer.deadLetterNow === "function") {
      const result = await consumer.deadLetterNow(delivery, {
        errorClass: "poison",
        attempts: 0,
        error: `the message is ${size} bytes, beyond the ${this.#maxBodyBytes} bytes this transport can carry through a deferral or a replay (maxMessageBytes ${this.#config.maxMessageBytes} less the wrapper)`,
      });
      return { action: result.ack ? { kind: "ack" } : { kind: "none" }, event: { ...event, result } };
    }

    let result: DeliveryResult;
    let thrownResult: { outcome: "thrown"; error: string } | undefined;
    try {
      result = await consumer.deliver(delivery);
    } catch (thrown) {
      thrownResult = { outcome: "thrown", error: describeError(thrown) };
      result = { outcome: "dead_letter_failed", ack: false, error: thrownResult.error };
    }
    if (result.ack) return { action: { kind: "ack" }, event: { ...event, result } };
    // A delivery that threw, or whose dead letter could not be written: not
    // acknowledged, and kept alive past the service's cap or expiry.
    if (thrownResult !== undefined || result.outcome === "dead_letter_failed") {
      return {
        action: await this.#unacknowledged(
          lane,
          message,
          expiresAt,
          { ...carried, attemptsSpent: deliveryCount },
          body,
          delivery,
        ),
        event: { ...event, result: thrownResult ?? result },
      };
    }

    const afterSeconds =
      Number.isFinite(result.retryAfterMs) && result.retryAfterMs >= 0
        ? Math.max(1, Math.ceil(result.retryAfterMs / 1000))
        : this.#config.visibilityTimeoutSeconds;
    // A retry that spends the attempt waits on its lease, if the lease can
    // hold it and the service will still deliver it then.
    if (result.spendsAttempt && afterSeconds <= VERCEL_MAX_VISIBILITY_SECONDS && fitsBefore(afterSeconds)) {
      return { action: { kind: "visibility", seconds: afterSeconds }, event: { ...event, result } };
    }
    // Otherwise a fresh copy carries it: a wait that must not count (rate
    // limit, handler never started), one longer than a lease, or one the
    // service would not live to deliver (past the cap or the retention).
    const head: WrapperHead = {
      ...carried,
      attemptsSpent: result.spendsAttempt ? deliveryCount : deliveryCount - 1,
      deferrals: result.spendsAttempt ? deferrals : deferrals + 1,
    };
    let stored: "stored" | "accepted";
    try {
      stored = await this.#republish(lane, message, head, body, afterSeconds);
    } catch (thrown) {
      const error = describeError(thrown);
      const fallback = Math.min(afterSeconds, VERCEL_MAX_VISIBILITY_SECONDS);
      if (fitsBefore(fallback)) {
        // The message must not be lost: wait on the lease instead. A wait
        // that spends no attempt is recorded as a hold, so the comeback is not
        // one either (the deferral is not counted in `deferrals`).
        this.#incident({
          kind: "republish_failed",
          queue: consumer.queue,
          consumer: consumer.name,
          messageId: message.messageId,
          message: `could not republish a deferral (${error}); delaying the lease ${fallback} s instead`,
          alert: false,
        });
        const wait: Action = { kind: "visibility", seconds: fallback };
        return {
          action: result.spendsAttempt ? wait : await this.#keep(lane, message, key, wait),
          event: { ...event, result },
        };
      }
      // Neither a copy nor the lease can bring it back: the dead letter now.
      const expiring = !last;
      return {
        action: await this.#deadLetterNow(lane, message, delivery, {
          errorClass: expiring ? "expired" : "exhausted",
          attempts: head.attemptsSpent,
          error: `${result.error} (a redelivery in ${afterSeconds} s would come ${expiring ? `after the message expires at ${new Date(expiresAt).toISOString()}` : `after its last permitted delivery (${lane.maxDeliveries})`}, and republishing it failed: ${error})`,
        }),
        event: { ...event, result },
      };
    }
    if (stored === "accepted") {
      // 202: "accepted for deferred processing", no id: the copy is not known
      // stored, so the original is kept, leased a little past the copy's
      // delay. If the copy arrives first, it marks the hold and the original
      // then goes without running; if not, the original runs — and a wait
      // that spent no attempt is a recorded hold, so that run is not counted.
      const insurance = Math.min(afterSeconds + 60, VERCEL_MAX_VISIBILITY_SECONDS);
      if (fitsBefore(insurance)) {
        const wait: Action = { kind: "visibility", seconds: insurance };
        return {
          action: result.spendsAttempt ? wait : await this.#keep(lane, message, key, wait),
          event: { ...event, result },
        };
      }
      // The service would drop the original before the insurance ends: the
      // dead letter holds the job now (a copy stored after all finds it
      // pending and does not run; an operator replays it).
      return {
        action: await this.#deadLetterNow(lane, message, delivery, {
          errorClass: last ? "exhausted" : "expired",
          attempts: head.attemptsSpent,
          error: `${result.error} (its redelivery copy was accepted without being stored (202), and the message ${last ? `is at its last permitted delivery (${lane.maxDeliveries})` : `expires at ${new Date(expiresAt).toISOString()}`}: dead-lettered rather than risk losing the job)`,
        }),
        event: { ...event, result },
      };
    }
    return { action: { kind: "ack", event: "deferred", afterSeconds }, event: { ...event, result } };
  }

  /**
   * A delivery left unacknowledged (the consumer threw, or its dead letter
   * could not be written) normally waits for the service's redelivery; if that
   * would come past the cap or the retention, a fresh copy carries it instead.
   */
  async #unacknowledged(
    lane: Lane,
    message: QueueMessage,
    expiresAt: number,
    head: WrapperHead,
    body: string | Uint8Array,
    delivery: Delivery,
  ): Promise<Action> {
    const last = message.deliveryCount >= lane.maxDeliveries;
    const comesBack = this.#clock.now() + lane.redeliverySeconds * 1000 + EXPIRY_MARGIN_MS <= expiresAt;
    if (!last && comesBack) return { kind: "none" };
    const why = last ? `its last permitted delivery (${lane.maxDeliveries})` : "its expiry";
    let stored: "stored" | "accepted";
    try {
      stored = await this.#republish(lane, message, head, body, lane.redeliverySeconds);
    } catch (error) {
      // No successor known stored, and this message is about to be dropped:
      // the dead letter holds the job now, as after a 202 (a copy stored
      // after all finds the letter pending and does not run).
      return this.#deadLetterNow(lane, message, delivery, {
        errorClass: last ? "exhausted" : "expired",
        attempts: head.attemptsSpent,
        error: `delivery ${message.deliveryCount} was not acknowledged at ${why}, and republishing it failed (${describeError(error)}): dead-lettered rather than risk losing the job`,
      });
    }
    if (stored === "accepted") {
      // 202: the copy is not known to be stored, and this message is about to
      // be dropped: the dead letter now holds the job (a copy stored after
      // all finds the letter and does not run; an operator replays it).
      return this.#deadLetterNow(lane, message, delivery, {
        errorClass: last ? "exhausted" : "expired",
        attempts: head.attemptsSpent,
        error: `delivery ${message.deliveryCount} was not acknowledged at ${why}, and the service accepted its rescue copy without storing it (202): dead-lettered rather than risk losing the job`,
      });
    }
    this.#incident({
      kind: "rescued_before_drop",
      queue: lane.consumer.queue,
      consumer: lane.consumer.name,
      messageId: message.messageId,
      message: `delivery ${message.deliveryCount} was not acknowledged at ${why}: republished with the ${head.attemptsSpent} attempts spent`,
      alert: false,
    });
    return { kind: "ack" };
  }

  async #deadLetterNow(
    lane: Lane,
    message: QueueMessage,
    delivery: Delivery,
    reason: { errorClass: "exhausted" | "expired"; attempts: number; error: string },
  ): Promise<Action> {
    const { consumer } = lane;
    const report = (kind: VercelIncident["kind"], text: string, alert: boolean) =>
      this.#incident({
        kind,
        queue: consumer.queue,
        consumer: consumer.name,
        messageId: message.messageId,
        message: text,
        alert,
      });
    if (typeof consumer.deadLetterNow !== "function") {
      report("job_at_risk", `${reason.error}; this consumer cannot write its dead letter now`, true);
      return { kind: "none" };
    }
    const result = await consumer.deadLetterNow(delivery, reason);
    if (!result.ack) {
      report("job_at_risk", `${reason.error}; its dead letter could not be written either`, true);
      return { kind: "none" };
    }
    report("dead_lettered_before_drop", reason.error, false);
    return { kind: "ack" };
  }

  /**
   * Republishes a job for this consumer (a deferral, a hop, a rescue) with
   * `delaySeconds`, under an idempotency key of this delivery. "accepted":
   * the service answered 202 (stored later, no id).
   */
  async #republish(
    lane: Lane,
    message: QueueMessage,
    head: WrapperHead,
    body: string | Uint8Array,
    delaySeconds: number,
    notBefore?: number,
  ): Promise<"stored" | "accepted"> {
    const hop = delaySeconds > this.#maxDelaySeconds;
    const until = notBefore ?? (hop ? this.#clock.now() + delaySeconds * 1000 : undefined);
    const wrapped = this.#wrappers.encode(
      {
        ...head,
        ...(until !== undefined && hop ? { notBefore: until } : {}),
        // Whom this copy succeeds, for a predecessor kept while it was not known stored.
        origin: `${messageKey(lane.topic, message)}:${message.deliveryCount}`,
      },
      body,
    );
    const sending = this.#send(
      lane.topic,
      wrapped,
      Math.min(delaySeconds, this.#maxDelaySeconds),
      republishKey({
        consumer: lane.consumer.name,
        topic: lane.topic,
        deploymentId: this.#config.deploymentId,
        createdAt: message.createdAt.getTime(),
        messageId: message.messageId,
        deliveryCount: message.deliveryCount,
        body: message.payload,
      }),
    );
    // No answer in time is no answer: the copy is not known stored (throws,
    // and every caller keeps the original).
    const { stored } = await withinMs(
      sending,
      this.#config.republishTimeoutMs,
      () => new Error(`the service did not answer a republish within ${this.#config.republishTimeoutMs} ms`),
    );
    return stored ? "stored" : "accepted";
  }

  /**
   * Keeps a message whose successor is not known stored, without spending
   * an attempt: the hold is recorded (`BoundConsumer.holds`), so its next
   * delivery is not counted as one. A hold that cannot be recorded is an
   * incident: that delivery then counts (never a lost job, at worst an early
   * dead letter an operator replays).
   */
  async #keep(lane: Lane, message: QueueMessage, key: string, action: Action): Promise<Action> {
    const holds = lane.consumer.holds;
    if (action.kind === "ack" || holds === undefined) return action;
    try {
      await holds.record(key, message.deliveryCount);
    } catch (error) {
      this.#incident({
        kind: "hold_unrecorded",
        queue: lane.consumer.queue,
        consumer: lane.consumer.name,
        messageId: message.messageId,
        message: `delivery ${message.deliveryCount} was kept without spending an attempt, but the hold could not be recorded (${describeError(error)}): its next delivery counts as one`,
        alert: false,
      });
    }
    return action;
  }

  /** The holds of earlier deliveries of this message; none known when they cannot be read (an incident). */
  async #keptBefore(
    lane: Lane,
    message: QueueMessage,
    key: string,
  ): Promise<{ readonly holds: number; readonly succeeded: boolean } | undefined> {
    const holds = lane.consumer.holds;
    if (holds === undefined) return undefined;
    try {
      return await holds.before(key, message.deliveryCount);
    } catch (error) {
      this.#incident({
        kind: "hold_unrecorded",
        queue: lane.consumer.queue,
        consumer: lane.consumer.name,
        messageId: message.messageId,
        message: `the holds of message ${message.messageId} could not be read (${describeError(error)}): delivery ${message.deliveryCount} counts every earlier one as an attempt`,
        alert: false,
      });
      return undefined;
    }
  }

  /** Marks the delivery `origin` names as succeeded by this copy; best effort (its predecessor then just runs again). */
  async #successorArrived(lane: Lane, message: QueueMessage, origin: string): Promise<void> {
    const holds = lane.consumer.holds;
    const at = origin.lastIndexOf(":");
    const count = Number(origin.slice(at + 1));
    if (holds === undefined || at <= 0 || !Number.isSafeInteger(count)) return;
    try {
      await holds.succeeded(origin.slice(0, at), count);
    } catch (error) {
      this.#logger.warn(
        `${lane.consumer.name}: could not mark the predecessor of message ${message.messageId} (${describeError(error)}); it runs again when it comes back`,
      );
    }
  }

  #incident(incident: VercelIncident): void {
    this.#incidents.set(incident.kind, (this.#incidents.get(incident.kind) ?? 0) + 1);
    const fields = {
      kind: incident.kind,
      queue: incident.queue,
      consumer: incident.consumer,
      messageId: incident.messageId,
    };
    if (incident.alert || incident.kind.endsWith("_failed")) this.#logger.error(incident.message, fields);
    else this.#logger.warn(incident.message, fields);
    // An observer's bug must not change what happens to the message.
    try {
      this.#metrics?.transportIncident?.({ queue: incident.queue, consumer: incident.consumer, kind: incident.kind });
    } catch {}
    try {
      this.#onIncident?.(incident);
    } catch {}
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
  readonly failed: Promise<Error>;
  #inFlight = 0;
  #stopping = false;
  #failure: Error | undefined;
  #authFailures = 0;
  #lastReceiveAt: number | undefined;
  #lastError: string | undefined;
  #resolveFailed: (error: Error) => void = () => {};
  readonly #wakers = new Set<() => void>();

  constructor(
    receive: () => Promise<"delivered" | "empty">,
    options: {
      readonly concurrency: number;
      readonly idleDelayMs: number;
      readonly errorDelayMs: number;
      readonly authAlertAfter: number;
      readonly maxAuthFailures: number;
    },
    clock: Clock,
    incident: (kind: VercelIncident["kind"], message: string, alert: boolean) => void,
    logger: Logger,
    label: string,
  ) {
    this.failed = new Promise((resolve) => {
      this.#resolveFailed = resolve;
    });
    const lane = async () => {
      while (!this.#stopping) {
        let wait = 0;
        this.#inFlight += 1;
        try {
          if ((await receive()) === "empty") wait = options.idleDelayMs;
          this.#authFailures = 0;
          this.#lastReceiveAt = clock.now();
        } catch (error) {
          if (!(error instanceof NotAcknowledged)) {
            // The service or the network failed: back off, the messages stay queued.
            this.#lastError = describeError(error);
            wait = options.errorDelayMs;
            if (authFailure(error)) {
              // Off Vercel, an expired OIDC token can only be refreshed through a
              // linked Vercel CLI: retrying forever would hide a stalled worker
              // while its messages run out of retention.
              this.#authFailures += 1;
              const n = this.#authFailures;
              if (n >= options.maxAuthFailures && !this.#failure) {
                this.#failure = new Error(
                  `vercel worker ${label}: ${n} consecutive auth failures (last: ${this.#lastError}); stopped. Renew the token (VERCEL_OIDC_TOKEN, or options.token) and restart the worker`,
                );
                incident("worker_failed", this.#failure.message, true);
                this.#stopping = true;
                for (const wake of this.#wakers) wake();
                this.#resolveFailed(this.#failure);
              } else if (n === options.authAlertAfter) {
                incident(
                  "auth_failed",
                  `vercel worker ${label}: ${n} consecutive auth failures (${this.#lastError}); it stops after ${options.maxAuthFailures}`,
                  true,
                );
              } else {
                incident("auth_failed", `vercel worker ${label}: receive refused: ${this.#lastError}`, false);
              }
            } else {
              logger.warn(`vercel worker ${label}: receive failed: ${this.#lastError}`);
            }
          }
        } finally {
          this.#inFlight -= 1;
        }
        if (wait > 0 && !this.#stopping) await this.#sleep(wait);
      }
    };
    this.done = Promise.all(Array.from({ length: options.concurrency }, lane)).then(() => {});
    this.#authAlertAfter = options.authAlertAfter;
  }

  readonly #authAlertAfter: number;

  get inFlight(): number {
    return this.#inFlight;
  }

  health(): VercelWorkerHealth {
    const state = this.#failure
      ? "failed"
      : this.#stopping
        ? "stopped"
        : this.#authFailures >= this.#authAlertAfter
          ? "degraded"
          : "running";
    return {
      state,
      consecutiveAuthFailures: this.#authFailures,
      lastReceiveAt: this.#lastReceiveAt,
      lastError: this.#lastError,
    };
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
      const timer = setTimeout(wake, timerDelay(ms));
      this.#wakers.add(wake);
    });
  }
}

/** A worker's live and replay poll loops, seen as one worker. */
class CombinedWorker implements VercelWorker {
  readonly done: Promise<void>;
  readonly failed: Promise<Error>;
  readonly #parts: readonly PollWorker[];

  constructor(parts: readonly PollWorker[]) {
    this.#parts = parts;
    this.done = Promise.all(parts.map((p) => p.done)).then(() => {});
    this.failed = Promise.race(parts.map((p) => p.failed));
    // One loop that can no longer receive fails the worker: the others stop too.
    void this.failed.then(() => this.stop());
  }

  get inFlight(): number {
    return this.#parts.reduce((sum, p) => sum + p.inFlight, 0);
  }

  health(): VercelWorkerHealth {
    // The worst of its loops: one that cannot receive is the worker's state.
    const order = ["failed", "degraded", "running", "stopped"] as const;
    const all = this.#parts.map((p) => p.health());
    return all.reduce((worst, h) => (order.indexOf(h.state) < order.indexOf(worst.state) ? h : worst));
  }

  async stop(): Promise<void> {
    await Promise.all(this.#parts.map((p) => p.stop()));
  }
}

/**
 * Creates the Vercel Queues adapter. Reads and checks its configuration now
 * (`InvalidConfigError` listing what is missing), so a module fails at start.
 */
export function createVercelQueue(options: VercelQueueOptions = {}): VercelQueue {
  return new VercelQueueAdapter(options);
}

// ---------------------------------------------------------------------------
// vercel.json trigger blocks

export interface VercelTriggerOptions {
  /** The route file serving the consumer: its key under vercel.json `functions` (e.g. "app/api/queues/award-points/route.ts"). */
  readonly route: string;
  /**
   * Database connections this consumer's deliveries may hold at once, across
   * every invocation (its share of the pool / max_connections). Each delivery
   * holds one at a time (its work transaction, then its dead-letter decision).
   */
  readonly databaseConnections: number;
  /** The trigger's concurrency cap. @default databaseConnections; never above it */
  readonly maxConcurrency?: number;
  /** Wait after a failed callback. @default 60 */
  readonly retryAfterSeconds?: number;
  /** Deliveries before the service drops the message. @default DEFAULT_MAX_DELIVERIES; at least maxAttempts + 2 */
  readonly maxDeliveries?: number;
}

/** One `queue/v2beta` entry of a function's `experimentalTriggers`. */
export interface VercelTrigger {
  readonly type: "queue/v2beta";
  readonly topic: string;
  readonly retryAfterSeconds: number;
  readonly maxDeliveries: number;
  readonly maxConcurrency: number;
}

export interface VercelFunctionsConfig {
  readonly functions: Readonly<Record<string, { readonly experimentalTriggers: readonly [VercelTrigger] }>>;
}

/**
 * The trigger of a consumer's route, from its definition: every option
 * written out (the server's defaults are undocumented; an older trigger
 * version dropped messages after 3 deliveries), and checked the way the
 * adapter checks the route when it is bound (`pushHandler(bound, { maxDeliveries, retryAfterSeconds })`).
 */
export function vercelTrigger(
  consumer: { readonly name: string; readonly queue: string; readonly retryPolicy?: { readonly maxAttempts: number } },
  options: VercelTriggerOptions,
): { readonly route: string; readonly trigger: VercelTrigger } {
  const owner = `vercel trigger of consumer ${JSON.stringify(consumer?.name)}`;
  if (typeof options?.route !== "string" || options.route.trim() === "") {
    throw new InvalidConfigError(`${owner}: route must name the route file serving it`);
  }
  const maxAttempts = consumer.retryPolicy?.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  const maxDeliveries = positiveInteger(options.maxDeliveries ?? DEFAULT_MAX_DELIVERIES, "maxDeliveries");
  if (maxDeliveries < maxAttempts + 2) {
    throw new InvalidConfigError(
      `${owner}: maxDeliveries ${maxDeliveries} is below maxAttempts + 2 (${maxAttempts + 2}); the service would drop jobs before the harness dead-letters them`,
    );
  }
  const connections = positiveInteger(options.databaseConnections, "databaseConnections");
  const maxConcurrency = positiveInteger(options.maxConcurrency ?? connections, "maxConcurrency");
  if (maxConcurrency > connections) {
    throw new InvalidConfigError(
      `${owner}: maxConcurrency ${maxConcurrency} is above its ${connections} database connections; deliveries beyond them would wait for a connection while their leases run`,
    );
  }
  return {
    route: options.route,
    trigger: {
      type: "queue/v2beta",
      topic: toVercelTopic(consumer.queue),
      retryAfterSeconds: positiveInteger(options.retryAfterSeconds ?? 60, "retryAfterSeconds"),
      maxDeliveries,
      maxConcurrency,
    },
  };
}

/** The vercel.json `functions` block of these triggers (one `queue/v2beta` trigger per function, as Vercel allows). */
export function vercelFunctionsConfig(
  triggers: readonly { readonly route: string; readonly trigger: VercelTrigger }[],
): VercelFunctionsConfig {
  const functions: Record<string, { readonly experimentalTriggers: readonly [VercelTrigger] }> = {};
  for (const { route, trigger } of triggers) {
    if (functions[route]) {
      throw new InvalidConfigError(
        `vercel.json: route ${route} has two queue triggers; Vercel allows one per function`,
      );
    }
    functions[route] = { experimentalTriggers: [trigger] };
  }
  return { functions };
}
