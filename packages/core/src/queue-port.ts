import type { Envelope } from "./envelope.ts";
import { InvalidConfigError } from "./errors.ts";

export interface PublishOptions {
  /** Hold the message back this long before its first delivery. @default 0 */
  readonly delayMs?: number;
  /**
   * Transport-level de-duplication key, for adapters whose provider supports
   * one. Never pass the job_id here for a replay: the provider would drop the
   * replay inside its de-duplication window. The job_id fence already makes
   * redelivery harmless. @default none
   */
  readonly idempotencyKey?: string;
  /**
   * Deliver only to this consumer of the queue: a replay of one consumer's
   * dead letter must not reach the queue's other consumers (one of them may
   * have had its own letter for the job discarded on purpose). Adapters route
   * it to that consumer, or carry it in `Delivery.targetConsumer` so any other
   * consumer's harness acknowledges and skips it. @default every consumer
   */
  readonly targetConsumer?: string;
  /**
   * An operator's replay of a dead letter: delivered with `Delivery.replay`,
   * so the harness does not expire it (`maxAgeMs`) — someone decided it must
   * run. Adapters that can only carry it in an addressed message require
   * `targetConsumer` with it. @default false
   */
  readonly replay?: boolean;
}

export interface PublishReceipt {
  /** The transport's id for the message, when it gives one. */
  readonly messageId: string | null;
  /**
   * The transport says the message is stored (Vercel Queues: 201 with an
   * id; the in-process queue: always). False when it only accepted it (a
   * Vercel 202, "accepted for deferred processing": stored later, or never):
   * a path that republishes treats that copy as unknown — it keeps the
   * original, or publishes the job again later — and never as stored.
   */
  readonly stored: boolean;
}

/**
 * Whether a receipt says its message is stored. A receipt of a port written
 * before `stored` existed says so by its id (a null id was a 202).
 */
export function isStored(receipt: PublishReceipt | undefined): boolean {
  if (receipt === undefined || receipt === null) return false;
  return typeof receipt.stored === "boolean" ? receipt.stored : receipt.messageId !== null;
}

/**
 * Publishes `payload` until the transport says it is stored, at most `tries`
 * times — the same envelope each time, so a copy stored after all is a
 * duplicate the fence absorbs. True when stored; false when every try was
 * only accepted (a Vercel 202): publish it again later. Throws what
 * `publish` throws.
 */
export async function publishUntilStored(
  queue: QueuePort,
  queueName: string,
  payload: Envelope,
  tries: number,
): Promise<boolean> {
  for (let attempt = 1; ; attempt++) {
    if (isStored(await queue.publish(queueName, payload))) return true;
    if (attempt >= tries) return false;
  }
}

/**
 * How producers put jobs on queues. Every adapter validates the envelope
 * before sending: an invalid one throws `InvalidEnvelopeError` at the producer
 * and never becomes a message.
 */
export interface QueuePort {
  publish(queue: string, payload: Envelope, opts?: PublishOptions): Promise<PublishReceipt>;
  /** Delivers no earlier than `runAt`; a time in the past publishes now. */
  schedule(queue: string, payload: Envelope, runAt: Date): Promise<PublishReceipt>;
}

/**
 * An adapter's replay lane (SPEC §5: replay capacity apart from live
 * traffic): per consumer, a separate queue/topic the same consumer definition
 * reads with its own concurrency, so replays never take live slots.
 */
export interface ReplayLanePort {
  /**
   * Publishes `body` — a dead letter's payload, the bytes exactly as received,
   * never re-serialized — on the replay lane of `targetConsumer` of `queue`.
   * It is delivered with `Delivery.replay` and `Delivery.targetConsumer` set.
   */
  publishReplay(
    queue: string,
    body: string | Uint8Array,
    opts: { readonly targetConsumer: string },
  ): Promise<PublishReceipt>;
  /**
   * In-process transports only: whether `consumer` of `queue` is subscribed in
   * this process (a replay published where nobody reads it never runs).
   * Hosted transports leave it out: a registry of routes says what exists.
   */
  hasConsumer?(queue: string, consumer: string): boolean;
}

/** One delivery of one message, as a transport hands it to a consumer. */
export interface Delivery {
  /** The message body as received: the raw text or bytes, or a value the transport already decoded. */
  readonly body: string | Uint8Array | unknown;
  /**
   * Which run of the handler this is for this message, the first being 1. It
   * counts deliveries that may have run the handler, so a delivery that crashed
   * the worker counts; deferrals for rate limiting (see
   * `DeliveryResult.spendsAttempt`) do not.
   */
  readonly deliveryCount: number;
  /**
   * How many earlier deliveries of this message for this consumer ended
   * deferred without spending an attempt (outcomes `rate_limited`,
   * `yielded` and `deferred`), for a backoff that grows with each deferral. It keeps
   * counting across spent attempts (it is never reset). 0 or absent on a
   * fresh message.
   */
  readonly deferrals?: number | undefined;
  /** The transport's message id, for logs. */
  readonly messageId?: string | undefined;
  /** Set when the message was published for one consumer only (`PublishOptions.targetConsumer`). */
  readonly targetConsumer?: string | undefined;
  /**
   * When the message became deliverable, in ms since the epoch: its publish
   * time plus its delay (`delayMs`, `schedule`'s runAt). A consumer's
   * `maxAgeMs` counts from it; without it, from the job_id's creation time.
   */
  readonly dueAt?: number | undefined;
  /** Set when the message is an operator's replay (`PublishOptions.replay`): it is never expired. */
  readonly replay?: boolean | undefined;
}

/**
 * What the harness decided for a delivery, and what the transport must do:
 * `ack: true` removes the message; `ack: false` with `retryAfterMs` makes it
 * visible again after that delay; `ack: false` without it leaves the message
 * to the transport's own redelivery (visibility timeout).
 *
 * Outcomes:
 * - `success`: the handler's work and the fence committed together;
 * - `duplicate`: the fence was already there, nothing ran;
 * - `skipped`: the message was addressed to another consumer of the queue;
 * - `retry`: a transient failure, the attempt was spent;
 * - `rate_limited`: a rate limit said wait; the attempt was not spent;
 * - `yielded`: a marketing lane's consumer gave way to its channel's
 *   transactional backlog; the attempt was not spent;
 * - `deferred`: the handler never started (database unreachable; BEGIN, the
 *   lock or the fence failed): come back after `retryAfterMs`, the attempt
 *   was not spent;
 * - `dead_lettered`: exhausted, permanent or expired, a dead letter was written;
 * - `poison`: the payload is invalid, a dead letter was written with zero retries;
 * - `dead_letter_failed`: the dead letter could not be written; the message
 *   must come back, so that nothing is lost.
 */
export type DeliveryResult =
  | { readonly outcome: "success" | "duplicate" | "skipped"; readonly ack: true }
  | {
      readonly outcome: "dead_lettered" | "poison";
      readonly ack: true;
      readonly deadLetterId: string;
      readonly errorClass: string;
    }
  | {
      readonly outcome: "retry" | "rate_limited" | "yielded" | "deferred";
      readonly ack: false;
      readonly retryAfterMs: number;
      /**
       * False for `rate_limited`, `yielded` and `deferred`: the next delivery must not
       * count as a new attempt, and its `Delivery.deferrals` is one higher.
       */
      readonly spendsAttempt: boolean;
      readonly error: string;
    }
  | { readonly outcome: "dead_letter_failed"; readonly ack: false; readonly error: string };

export type DeliveryOutcome = DeliveryResult["outcome"];

/** A consumer bound to its dependencies, ready for a transport to feed deliveries to. */
export interface BoundConsumer {
  readonly name: string;
  readonly queue: string;
  /**
   * Longest a run may take, from asking for a connection to COMMIT (the
   * harness aborts it after this).
   */
  readonly timeoutMs?: number;
  /**
   * Longest one delivery may take, every part of it: the work transaction,
   * ROLLBACK after a failure, the dead-letter decision (`deliveryBoundMs`).
   * What a transport checks against its visibility timeout or lease
   * (`checkDeliveryBound`); `timeoutMs` where it is not given.
   */
  readonly deliveryBoundMs?: number;
  /**
   * The consumer's attempt budget (`RetryPolicy.maxAttempts`): a transport
   * whose provider drops a message after a number of deliveries refuses a cap
   * below `maxAttempts + 2` (the budget, the delivery past it that writes the
   * dead letter, and one for a letter that could not be written). @default 5
   */
  readonly maxAttempts?: number;
  deliver(delivery: Delivery): Promise<DeliveryResult>;
  /**
   * Writes the job's dead letter now, without running the handler, for a
   * transport that cannot bring the message back: its provider would drop it
   * (a delivery cap reached, its retention ending, a copy too large to
   * republish) and republishing it failed. Decided under the fence key like
   * every letter (a job whose fence exists is a `duplicate`); a letter that
   * cannot be written is `dead_letter_failed`. `attempts` is what the job
   * spent so far. Optional: a transport without it leaves the message as it is.
   */
  deadLetterNow?(
    delivery: Delivery,
    reason: {
      readonly errorClass: "exhausted" | "expired" | "poison";
      readonly attempts: number;
      readonly error: string;
    },
  ): Promise<DeliveryResult>;
  /**
   * Where a transport records the deliveries it kept without spending an
   * attempt, when its provider's delivery count cannot be corrected (Vercel
   * Queues counts leases, not handler runs): a deferral or a hop whose
   * successor the provider did not say it stored keeps the original on its
   * lease, and that original's next delivery must not count as an attempt.
   * Optional: a transport without it counts every delivery.
   */
  readonly holds?: TransportHolds;
  /**
   * Waits for the alerts of the dead letters this consumer wrote so far (and
   * `AlertPort.flush`), when there were any since the last call; never
   * throws. A transport whose process may end once a request is answered
   * (serverless) awaits it before answering.
   */
  flushAlerts?(): Promise<void>;
}

/**
 * The deliveries of one consumer's messages that a transport kept (on their
 * lease, or left to the provider's redelivery) without running the handler
 * or spending an attempt, durable across processes (`core.transport_holds`).
 * A message is named by a key the transport derives from its identity (its
 * topic, id and send time); `deliveryCount` is the provider's count.
 */
export interface TransportHolds {
  /**
   * Records that delivery `deliveryCount` of the message was kept without
   * spending an attempt (recording it twice is recording it once).
   */
  record(messageKey: string, deliveryCount: number): Promise<void>;
  /**
   * The holds recorded for deliveries of the message before `deliveryCount`,
   * and whether a successor of any of them (a copy republished from it) has
   * been delivered: then the job lives on in that copy.
   */
  before(messageKey: string, deliveryCount: number): Promise<{ readonly holds: number; readonly succeeded: boolean }>;
  /** A copy succeeding delivery `deliveryCount` of the message arrived (its first delivery). */
  succeeded(messageKey: string, deliveryCount: number): Promise<void>;
}

/**
 * A transport's check, when a consumer subscribes, that its deliveries end
 * before their message can be handed out again: the whole delivery
 * (`deliveryBoundMs`, else the handler's `timeoutMs`) must be below the
 * visibility timeout or lease, `leaseMs`, that `lease` names.
 */
export function checkDeliveryBound(consumer: BoundConsumer, leaseMs: number, lease: string): void {
  const bound = consumer.deliveryBoundMs ?? consumer.timeoutMs;
  if (bound === undefined || bound < leaseMs) return;
  const sum =
    consumer.deliveryBoundMs === undefined
      ? `its handler time bound (timeoutMs ${consumer.timeoutMs})`
      : `one delivery's bound (deliveryBoundMs ${bound}: the work transaction's timeoutMs ${consumer.timeoutMs}, ROLLBACK's allowance, the dead-letter decision's timeoutMs)`;
  throw new InvalidConfigError(
    `consumer "${consumer.name}": ${sum} must be below ${lease}, or a delivery could still be going when its message is delivered again`,
  );
}
