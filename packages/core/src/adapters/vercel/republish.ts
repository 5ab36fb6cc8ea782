/**
 * One delivery's decision (`Republisher.process`): unwrap it, hand it to the
 * harness, and pick what the service must do — acknowledge, wait on the
 * lease (a retry that spends its attempt and fits the lease and the
 * message's life), or republish a fresh copy and acknowledge the original.
 *
 * Which path reads which answer of its republish. Stored: 201 with an id
 * (`VercelService.send`). Not known stored: 202, or any answer without an
 * id (both "202" below), an error, or no answer within
 * `republishTimeoutMs`; a copy stored after all is a successor like any
 * other (its first delivery marks the hold of the original, holds.ts).
 * - hop (a message that came due before its time): stored → ack (should
 *   the ack fail, its comeback goes without running: holds.ts,
 *   `superseded`, as on every path that acks after a stored copy); not
 *   known stored → the original waits on its lease for the rest (a
 *   recorded hold), or, if the service would drop it first (its cap or its
 *   expiry), the dead letter now;
 * - deferral (a wait that spends no attempt) or a retry past the lease,
 *   the cap or the expiry: stored → ack ("deferred"); 202 → the original
 *   waits on its lease a minute past the copy's delay; an error or no
 *   answer → it waits on its lease for the delay — either wait a recorded
 *   hold unless the attempt was spent, and the dead letter now
 *   (`#deadLetterNow`) when the service would drop the original first;
 * - rescue (a delivery not acknowledged at the cap or the expiry,
 *   `#unacknowledged`): stored → ack; not known stored → the dead letter now.
 */
import type { Clock } from "../../clock.ts";
import { describeError } from "../../errors.ts";
import type { Delivery, DeliveryResult } from "../../queue-port.ts";
import { withinMs } from "../../timers.ts";
import {
  EXPIRY_MARGIN_MS,
  maxBodyBytes,
  maxDelaySeconds,
  VERCEL_MAX_VISIBILITY_SECONDS,
  type VercelQueueConfig,
} from "./config.ts";
import { keep, keptBefore, messageKey, sha256, successorArrived } from "./holds.ts";
import type { Incidents } from "./incidents.ts";
import type { Action, DeliveryContext, Lane, Processed } from "./lane.ts";
import { knownDeliveryCount, type QueueMessage, type VercelService } from "./service.ts";
import type { VercelIncident } from "./types.ts";
import type { WrapperCodec, WrapperHead } from "./wrapper.ts";

function byteLength(body: string | Uint8Array): number {
  return typeof body === "string" ? Buffer.byteLength(body, "utf8") : body.byteLength;
}

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
 * Whether the service may drop the message after this delivery: its last
 * permitted one, or one whose number the service did not say (then no
 * delivery can be told from the last, so the adapter never leaves the job
 * to the service's redelivery: a retry or a deferral goes in a fresh copy
 * that carries the attempts spent).
 */
function mayBeLast(lane: Lane, message: QueueMessage): boolean {
  const count = knownDeliveryCount(message);
  return count === undefined || count >= lane.maxDeliveries;
}

function lastText(lane: Lane, message: QueueMessage): string {
  return knownDeliveryCount(message) === undefined
    ? "a delivery whose number the service did not say (it may be the last permitted one)"
    : `its last permitted delivery (${lane.maxDeliveries})`;
}

export class Republisher {
  readonly #ctx: DeliveryContext;
  readonly #config: VercelQueueConfig;
  readonly #clock: Clock;
  readonly #incidents: Incidents;
  readonly #wrappers: WrapperCodec;
  readonly #service: VercelService;

  constructor(ctx: DeliveryContext, wrappers: WrapperCodec, service: VercelService) {
    this.#ctx = ctx;
    this.#config = ctx.config;
    this.#clock = ctx.clock;
    this.#incidents = ctx.incidents;
    this.#wrappers = wrappers;
    this.#service = service;
  }

  /**
   * One delivery: unwrap, hand it to the harness, and decide what the service
   * must do so that the message comes back when the harness asks — or, when
   * the service would drop it first (its delivery cap or its retention), so
   * that a fresh copy carries it on, or its dead letter is written now.
   */
  async process(lane: Lane, message: QueueMessage, expiresAt: number): Promise<Processed> {
    const read = await this.#read(lane, message);
    if (read === "gone") return { action: { kind: "ack" } };
    const { consumer } = lane;
    const { wrapper, body, carried, delivery, key, deliveryCount } = read;
    const now = this.#clock.now();
    const attemptsBefore = carried.attemptsSpent;
    const deferrals = carried.deferrals;
    const last = mayBeLast(lane, message);
    const fitsBefore = (waitSeconds: number) =>
      !last && this.#clock.now() + waitSeconds * 1000 + EXPIRY_MARGIN_MS <= expiresAt;

    // A hop: came due before its time (a wait longer than one message holds).
    if (wrapper?.notBefore !== undefined && wrapper.notBefore > now + 1_000) {
      const notBefore = wrapper.notBefore;
      const remaining = Math.ceil((notBefore - now) / 1000);
      let answer: "stored" | "accepted" | { readonly error: unknown };
      try {
        answer = await this.#republish(lane, message, carried, body, remaining, notBefore);
      } catch (error) {
        answer = { error };
      }
      if (answer === "stored") return { action: { kind: "ack", superseded: true } };
      // The next hop is not known stored (a 202, an error, no answer): this
      // one is kept — it waits on its lease and hops again (a copy stored
      // after all is a successor; the fence absorbs its run) — or, when the
      // service would drop it first, the dead letter holds the job now.
      const seconds = Math.min(remaining, VERCEL_MAX_VISIBILITY_SECONDS);
      const kind = answer === "accepted" ? "republish_unconfirmed" : "republish_failed";
      const what =
        answer === "accepted"
          ? `the service accepted the next hop of a message due in ${remaining} s without storing it yet (202, or no id)`
          : `could not republish a message due in ${remaining} s (${describeError(answer.error)})`;
      const keepIt = fitsBefore(seconds);
      this.#incidents.report({
        kind,
        queue: consumer.queue,
        consumer: consumer.name,
        messageId: message.messageId,
        message: `${what}; ${keepIt ? `the message is kept and hops again in ${seconds} s` : "the service would drop it first: dead-lettered now"}`,
        alert: false,
      });
      if (keepIt) return { action: await keep(this.#ctx, lane, message, key, { kind: "visibility", seconds }) };
      return {
        action: await this.#deadLetterNow(lane, message, delivery, {
          errorClass: last ? "exhausted" : "expired",
          attempts: attemptsBefore,
          error: `scheduled for ${new Date(notBefore).toISOString()}: ${what}, and the service would drop this message ${last ? `after ${lastText(lane, message)}` : `at its expiry (${new Date(expiresAt).toISOString()})`}; dead-lettered rather than risk losing the job — replay it at or after its time`,
        }),
      };
    }

    const event = { queue: consumer.queue, consumer: consumer.name, messageId: message.messageId, deliveryCount };

    // A body this transport could not wrap could never be deferred or
    // replayed: poison, as publish refuses it (another producer sent it).
    const size = byteLength(body);
    if (size > maxBodyBytes(this.#config) && typeof consumer.deadLetterNow === "function") {
      const result = await consumer.deadLetterNow(delivery, {
        errorClass: "poison",
        attempts: 0,
        error: `the message is ${size} bytes, beyond the ${maxBodyBytes(this.#config)} bytes this transport can carry through a deferral or a replay (maxMessageBytes ${this.#config.maxMessageBytes} less the wrapper)`,
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
        this.#incidents.report({
          kind: "republish_failed",
          queue: consumer.queue,
          consumer: consumer.name,
          messageId: message.messageId,
          message: `could not republish a deferral (${error}); delaying the lease ${fallback} s instead`,
          alert: false,
        });
        const wait: Action = { kind: "visibility", seconds: fallback };
        return {
          action: result.spendsAttempt ? wait : await keep(this.#ctx, lane, message, key, wait),
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
          action: result.spendsAttempt ? wait : await keep(this.#ctx, lane, message, key, wait),
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
          error: `${result.error} (its redelivery copy was accepted without being stored (202, or no id), and the message ${last ? `is at its last permitted delivery (${lane.maxDeliveries})` : `expires at ${new Date(expiresAt).toISOString()}`}: dead-lettered rather than risk losing the job)`,
        }),
        event: { ...event, result },
      };
    }
    return { action: { kind: "ack", event: "deferred", afterSeconds, superseded: true }, event: { ...event, result } };
  }

  /**
   * A push delivery whose lease the service would not confirm, twice, as
   * reaching past the message's expiry (400: the route's clock behind the
   * service's, or latency): the handler does not run on a lease it does not
   * hold, and the service drops the message at its expiry, so its dead
   * letter holds the job now (`expired`), as for any message the service
   * would drop first. Never skipped unseen: a 400 is not a forged callback's
   * answer (404/409).
   */
  async atExpiry(lane: Lane, message: QueueMessage, expiresAt: number, refusal: string): Promise<Processed> {
    const read = await this.#read(lane, message);
    if (read === "gone") return { action: { kind: "ack" } };
    const notBefore = read.wrapper?.notBefore;
    const due = notBefore !== undefined && notBefore > this.#clock.now() ? notBefore : undefined;
    return {
      action: await this.#deadLetterNow(lane, message, read.delivery, {
        errorClass: "expired",
        // This delivery did not run the handler: not an attempt.
        attempts: read.deliveryCount - 1,
        error: `${due !== undefined ? `scheduled for ${new Date(due).toISOString()}: ` : ""}the service refused to lease delivery ${message.deliveryCount} up to its expiry (${new Date(expiresAt).toISOString()} by the adapter's clock), even less a margin (${refusal}); the handler did not run, and the service drops the message at its expiry: dead-lettered rather than risk losing the job${due !== undefined ? " — replay it at or after its time" : ""}`,
      }),
    };
  }

  /**
   * What a delivery carries: its wrapper, the body, the head a copy of it
   * carries on, the delivery the harness is handed (its attempt counts every
   * earlier delivery but the holds), and its name in the hold store. "gone":
   * nothing to run — another consumer's copy, or a kept original whose
   * successor has arrived.
   */
  async #read(lane: Lane, message: QueueMessage) {
    const { consumer } = lane;
    const bytes = message.payload;
    const wrapper = this.#wrappers.read(bytes);
    // Another consumer's copy (a deferral, a replay): this consumer has its own.
    if (wrapper?.consumer !== undefined && wrapper.consumer !== consumer.name) return "gone" as const;
    const body = wrapper ? wrapper.body : bytes;
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
    const key = messageKey(lane.topic, message);
    // A copy republished from a delivery that was kept: its predecessor may go.
    if (wrapper?.origin !== undefined) await successorArrived(this.#ctx, lane, message, wrapper.origin);
    // Deliveries of this message the adapter kept without spending an attempt
    // (the service counts every lease): they are not attempts (#19).
    const count = knownDeliveryCount(message);
    const kept = count !== undefined && count > 1 ? await keptBefore(this.#ctx, lane, message, key) : undefined;
    // It was kept for a successor that has arrived since: the job lives on in that copy.
    if (kept?.succeeded) return "gone" as const;

    // A count the service did not say: this copy's first delivery (every
    // later one is a fresh copy carrying the attempts: mayBeLast).
    const deliveryCount = attemptsBefore + Math.max(1, (count ?? 1) - (kept?.holds ?? 0));
    const delivery: Delivery = {
      body,
      deliveryCount,
      messageId: message.messageId,
      dueAt,
      ...(wrapper?.consumer !== undefined || replayLane ? { targetConsumer: consumer.name } : {}),
      ...(deferrals > 0 ? { deferrals } : {}),
      ...(replay ? { replay: true } : {}),
    };
    return { wrapper, body, carried, delivery, key, deliveryCount };
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
    const last = mayBeLast(lane, message);
    const comesBack = this.#clock.now() + lane.redeliverySeconds * 1000 + EXPIRY_MARGIN_MS <= expiresAt;
    if (!last && comesBack) return { kind: "none" };
    const why = last ? lastText(lane, message) : "its expiry";
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
        error: `delivery ${message.deliveryCount} was not acknowledged at ${why}, and the service accepted its rescue copy without storing it (202, or no id): dead-lettered rather than risk losing the job`,
      });
    }
    this.#incidents.report({
      kind: "rescued_before_drop",
      queue: lane.consumer.queue,
      consumer: lane.consumer.name,
      messageId: message.messageId,
      message: `delivery ${message.deliveryCount} was not acknowledged at ${why}: republished with the ${head.attemptsSpent} attempts spent`,
      alert: false,
    });
    return { kind: "ack", superseded: true };
  }

  async #deadLetterNow(
    lane: Lane,
    message: QueueMessage,
    delivery: Delivery,
    reason: { errorClass: "exhausted" | "expired"; attempts: number; error: string },
  ): Promise<Action> {
    const { consumer } = lane;
    const report = (kind: VercelIncident["kind"], text: string, alert: boolean) =>
      this.#incidents.report({
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
   * the service answered without an id (a 202: stored later, or never).
   */
  async #republish(
    lane: Lane,
    message: QueueMessage,
    head: WrapperHead,
    body: string | Uint8Array,
    delaySeconds: number,
    notBefore?: number,
  ): Promise<"stored" | "accepted"> {
    const hop = delaySeconds > maxDelaySeconds(this.#config);
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
    const sending = this.#service.send(
      lane.topic,
      wrapped,
      Math.min(delaySeconds, maxDelaySeconds(this.#config)),
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
}
