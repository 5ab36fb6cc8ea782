/**
 * One leased message, start to end, for both delivery modes: the lease
 * lifecycle the adapter runs on the SDK's API client instead of the SDK's
 * own (which trusts a push callback's body without asking the service, lets
 * a renewal overwrite the directive, and only `console.warn`s a failed
 * acknowledgement). What the delivery decides is `Republisher.process`
 * (republish.ts); this file confirms, renews, applies and reports.
 */
import type { Clock } from "../../clock.ts";
import { describeError } from "../../errors.ts";
import type { Logger } from "../../ports/logger.ts";
import { withinMs } from "../../timers.ts";
import {
  DIRECTIVE_MAX_RETRY_AFTER_S,
  DIRECTIVE_TRIES,
  LEASE_SKEW_MARGIN_MS,
  type VercelQueueConfig,
} from "./config.ts";
import { keep, messageKey, superseded } from "./holds.ts";
import type { Incidents } from "./incidents.ts";
import type { DeliveryContext, Lane, Outcome, Processed } from "./lane.ts";
import type { Republisher } from "./republish.ts";
import { errorName, type LeaseApi, type LeaseRef, leaseGone, type QueueMessage } from "./service.ts";
import type { VercelIncident } from "./types.ts";

/** What a delivery mode (the push route, the poll loop) works with. */
export interface ModeContext extends DeliveryContext {
  readonly api: LeaseApi;
  readonly lease: LeaseRunner;
}

export class LeaseRunner {
  readonly #ctx: DeliveryContext;
  readonly #config: VercelQueueConfig;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #incidents: Incidents;
  readonly #republisher: Republisher;

  constructor(ctx: DeliveryContext, republisher: Republisher) {
    this.#ctx = ctx;
    this.#config = ctx.config;
    this.#clock = ctx.clock;
    this.#logger = ctx.logger;
    this.#incidents = ctx.incidents;
    this.#republisher = republisher;
  }

  /**
   * One leased message, start to end: confirm the lease (a push callback),
   * renew it while the consumer runs, wait for a renewal still in flight (so
   * it cannot land after the directive and undo it), apply the directive, and
   * report a directive that failed.
   */
  async consume(lane: Lane, message: QueueMessage, confirm: boolean): Promise<Outcome> {
    const expiresAt = this.#expiresAt(message);
    const ref: LeaseRef = { queueName: lane.topic, consumerGroup: lane.group, receiptHandle: message.receiptHandle };
    const incident = (kind: VercelIncident["kind"], text: string, alert = false) =>
      this.#incidents.report({
        kind,
        queue: lane.consumer.queue,
        consumer: lane.consumer.name,
        messageId: message.messageId,
        message: text,
        alert,
      });
    /** Taken off the expiry once the service refused a lease as reaching past it. */
    let marginMs = 0;
    /** A lease of `seconds`, never past the message's expiry (the service refuses that). */
    const leaseFor = (seconds: number) =>
      Math.max(0, Math.min(seconds, Math.floor((expiresAt - marginMs - this.#clock.now()) / 1000)));
    /**
     * A lease refused with 400 reached past the message's expiry as the
     * service counts it (this clock behind its own, or latency): the margin
     * comes off every later lease. False when it already had.
     */
    const takeMargin = () => {
      if (marginMs !== 0) return false;
      marginMs = LEASE_SKEW_MARGIN_MS;
      return true;
    };
    const vt = this.#config.visibilityTimeoutSeconds;

    let processed: Processed | undefined;
    if (confirm) {
      // Proof that the service leased this message to this consumer group
      // under this handle (and the lease the route works under, instead of
      // the server's short first one): a forged or stale callback gets 404/409.
      for (;;) {
        try {
          await this.#directive(() => lane.api.changeVisibility({ ...ref, visibilityTimeoutSeconds: leaseFor(vt) }));
          break;
        } catch (error) {
          if (leaseGone(error)) {
            incident(
              "unconfirmed_callback",
              `push callback for message ${message.messageId} not confirmed by the service (${describeError(error)}); the handler did not run`,
            );
            return "skipped";
          }
          if (errorName(error) === "BadRequestError") {
            // Past the expiry: once more with the margin off. Refused again,
            // the message is at its expiry: its dead letter now, as for any
            // message the service would drop first — never skipped unseen.
            if (takeMargin() && leaseFor(vt) > 0) continue;
            processed = await this.#republisher.atExpiry(lane, message, expiresAt, describeError(error));
            break;
          }
          // A 5xx, or the network past its retries: the handler did not run,
          // and the service delivers it again after the route's 500. This
          // delivery was kept, not spent: a hold, so that one is not counted.
          await keep(this.#ctx, lane, message, messageKey(lane.topic, message), { kind: "none" });
          throw error;
        }
      }
    }
    const done = processed ?? (await this.#processRenewing(lane, message, expiresAt, ref, leaseFor, takeMargin));

    const { action } = done;
    const emit = (applied: boolean) => {
      if (!done.event) return;
      if (action.kind === "ack") {
        this.#incidents.emit({
          ...done.event,
          action: action.event ?? "ack",
          ...(action.afterSeconds !== undefined ? { afterSeconds: action.afterSeconds } : {}),
          applied,
        });
      } else if (action.kind === "visibility") {
        this.#incidents.emit({ ...done.event, action: "visibility", afterSeconds: action.seconds, applied });
      } else this.#incidents.emit({ ...done.event, action: "none", applied });
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
      // Its job lives on in a copy known stored: the original's comeback
      // must go without running, not run as the next attempt.
      if (action.kind === "ack" && action.superseded) await superseded(this.#ctx, lane, message);
      emit(false);
      return "directive_failed";
    }
    emit(true);
    return "done";
  }

  /**
   * The delivery's decision, its lease renewed while it runs; a renewal
   * still in flight is waited for, so it cannot land after the directive.
   * `takeMargin` is called for a renewal refused as past the message's
   * expiry (400): true when the next one is asked with the margin off.
   */
  async #processRenewing(
    lane: Lane,
    message: QueueMessage,
    expiresAt: number,
    ref: LeaseRef,
    leaseFor: (seconds: number) => number,
    takeMargin: () => boolean,
  ): Promise<Processed> {
    const vt = this.#config.visibilityTimeoutSeconds;
    const incident = (text: string) =>
      this.#incidents.report({
        kind: "lease_renewal_failed",
        queue: lane.consumer.queue,
        consumer: lane.consumer.name,
        messageId: message.messageId,
        message: text,
        alert: false,
      });
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
          incident(`lease renewal failed: ${describeError(error)}`);
          // A lease that is gone stays gone, and one refused as past the
          // expiry with the margin already off cannot be had (the lease held
          // runs out with the message); anything else is tried again soon.
          const again = leaseGone(error) ? false : errorName(error) === "BadRequestError" ? takeMargin() : true;
          if (again && !stopped) timer = setTimeout(renew, Math.min(3_000, this.#config.leaseRenewalMs)).unref();
        }
      })();
    };
    // Unref'd like the core's other timers: the delivery itself keeps the process busy.
    timer = setTimeout(renew, this.#config.leaseRenewalMs).unref();
    try {
      return await this.#republisher.process(lane, message, expiresAt);
    } catch (error) {
      this.#logger.error(`${lane.consumer.name}: delivery failed: ${describeError(error)}`, {
        messageId: message.messageId,
      });
      return { action: { kind: "none" } };
    } finally {
      stopped = true;
      clearTimeout(timer);
      // A renewal already sent must finish before the directive, or it could
      // land after it and move the lease back to the full visibility timeout.
      // One the service never answers must not hold the delivery for ever
      // (its directive never sent, a push route kept until the platform ends
      // it): past the bound of the adapter's own calls, the directive goes.
      if (renewal !== undefined) {
        const bound = this.#config.republishTimeoutMs;
        await withinMs(renewal, bound, () => new Error(`no answer within ${bound} ms`)).catch((error: unknown) =>
          incident(
            `a lease renewal still in flight did not finish (${describeError(error)}): the delivery's directive goes without it; if the renewal lands later, the message may come back later than asked`,
          ),
        );
      }
    }
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

  /**
   * When the service drops the message; when it does not say, the retention
   * this adapter sends with, from the send (the SDK's own guess, a day,
   * would make a message older than a day a lease of 0 s). A guess too late
   * is corrected by the service: a lease past the real expiry is refused (400).
   */
  #expiresAt(message: QueueMessage): number {
    const reported = message.expiresAt?.getTime();
    return reported !== undefined && Number.isFinite(reported)
      ? reported
      : message.createdAt.getTime() + this.#config.retentionSeconds * 1000;
  }
}
