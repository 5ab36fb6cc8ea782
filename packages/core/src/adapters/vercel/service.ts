/**
 * The service, as the SDK reaches it: the raw wire format (`rawTransport`),
 * the part of the SDK's API client the lease lifecycle drives (`LeaseApi`,
 * `leaseApiOf`), how its answers are read by name (`errorName`, `leaseGone`,
 * `authFailure`), and the one send every publish and republish goes through,
 * which turns the SDK's answer into a `PublishReceipt`: 201 with an id is
 * stored; 202, or any answer without a non-empty id, is not known stored.
 */
import { QueueClient, type Transport } from "@vercel/queue";
import { InvalidConfigError, InvalidEnvelopeError } from "../../errors.ts";
import type { PublishReceipt } from "../../queue-port.ts";
import type { VercelQueueConfig } from "./config.ts";

/**
 * Bytes in, bytes out: the SDK's JsonTransport would throw on a body that is
 * not JSON before our handler runs, and the message would loop instead of
 * becoming a poison dead letter with its payload exactly as received.
 */
export const rawTransport: Transport<Uint8Array> = {
  contentType: "application/json",
  serialize: (value) => Buffer.from(value.buffer, value.byteOffset, value.byteLength),
  async deserialize(stream) {
    const chunks: Uint8Array[] = [];
    for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(chunk);
    return Buffer.concat(chunks);
  },
};

/** What the service answered, read by name (the SDK's error classes may be loaded twice). */
export function errorName(error: unknown): string {
  return error instanceof Error ? error.name : "";
}

export const leaseGone = (error: unknown) =>
  errorName(error) === "MessageNotFoundError" || errorName(error) === "MessageNotAvailableError";

/**
 * The message's delivery number as the service counts them, or undefined
 * when it did not say: the SDK leaves a missing ce-vqsdeliverycount out of
 * a push callback, reads a missing Vqs-Delivery-Count as 0, and parses
 * either with parseInt (NaN for anything else).
 */
export function knownDeliveryCount(message: Pick<QueueMessage, "deliveryCount">): number | undefined {
  const count = message.deliveryCount;
  return Number.isSafeInteger(count) && count >= 1 ? count : undefined;
}

export const authFailure = (error: unknown) =>
  errorName(error) === "UnauthorizedError" ||
  errorName(error) === "ForbiddenError" ||
  (error instanceof Error && /OIDC token/i.test(error.message));

/** A received message as the SDK's API client returns it. */
export interface QueueMessage {
  readonly messageId: string;
  /** The service's count of this message's deliveries; read with `knownDeliveryCount`. */
  readonly deliveryCount: number;
  readonly createdAt: Date;
  readonly expiresAt?: Date | undefined;
  readonly receiptHandle: string;
  readonly payload: Uint8Array;
}

export interface LeaseRef {
  readonly queueName: string;
  readonly consumerGroup: string;
  readonly receiptHandle: string;
}

/**
 * The part of the SDK's `ApiClient` the adapter drives: the same requests,
 * auth (token or OIDC), region routing and deployment header as the SDK's
 * own consumers, without their lifecycle.
 */
export interface LeaseApi {
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

/** The SDK's client for one configuration: its sends, and the API client the lease lifecycle drives. */
export class VercelService {
  readonly api: LeaseApi;
  readonly #config: VercelQueueConfig;
  readonly #client: QueueClient;

  constructor(config: VercelQueueConfig, resolveBaseUrl: ((region: string) => URL) | undefined) {
    this.#config = config;
    this.#client = new QueueClient({
      region: config.region,
      deploymentId: config.deploymentId,
      transport: rawTransport as Transport,
      ...(config.token !== undefined ? { token: config.token } : {}),
      ...(resolveBaseUrl ? { resolveBaseUrl } : {}),
    });
    this.api = leaseApiOf(this.#client);
  }

  async send(
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
    const answer: unknown = await this.#client.send(topic, body, {
      // Always the longest retention: a route or database outage shorter than
      // it loses nothing; the delay is counted within it.
      retentionSeconds: this.#config.retentionSeconds,
      ...(delaySeconds > 0 ? { delaySeconds } : {}),
      // Only a key the caller chose: one derived from the job_id would swallow replays.
      ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
    });
    // Stored only when the service names the copy: 201 with an id. 202
    // ("accepted for deferred processing") answers none, and any other 2xx
    // without a non-empty id (the SDK passes a 200 `{}` or a 201 `""`
    // through as it came) says nothing was stored: not known stored.
    const messageId = (answer as { messageId?: unknown } | null)?.messageId;
    const id = typeof messageId === "string" && messageId.length > 0 ? messageId : null;
    return { messageId: id, stored: id !== null };
  }
}
