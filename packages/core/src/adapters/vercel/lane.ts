/**
 * One consumer bound to one delivery mode (a `Lane`): how it is bound and
 * checked against the transport (`bindLane`), what a delivery ends with on
 * the service (`Action`, `Processed`, `Outcome`), what every part of a
 * delivery works with (`DeliveryContext`), and the dead-letter alert flush
 * both delivery modes end with before they answer (`flushAlerts`).
 */
import type { Clock } from "../../clock.ts";
import { describeError, InvalidConfigError } from "../../errors.ts";
import type { Logger } from "../../ports/logger.ts";
import { type BoundConsumer, checkDeliveryBound } from "../../queue-port.ts";
import { positiveInteger } from "../../validate.ts";
import {
  ALERT_FLUSH_TIMEOUT_MS,
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_MAX_DELIVERIES,
  type VercelQueueConfig,
} from "./config.ts";
import type { Incidents } from "./incidents.ts";
import type { LeaseApi } from "./service.ts";
import { toVercelReplayTopic, toVercelTopic } from "./topics.ts";
import type { VercelDeliveryEvent } from "./types.ts";

/** What every part of a delivery works with: the adapter's configuration and observers. */
export interface DeliveryContext {
  readonly config: VercelQueueConfig;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly incidents: Incidents;
}

/** One consumer bound to one delivery mode: what its deliveries need to know. */
export interface Lane {
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

export type Outcome = "done" | "skipped" | "not_acknowledged" | "directive_failed";

/** What a delivery ends with on the service. */
export type Action =
  | {
      readonly kind: "ack";
      readonly event?: "ack" | "deferred";
      readonly afterSeconds?: number;
      /**
       * The job lives on in a copy known stored (201 with an id): should this
       * acknowledgement fail, the original's comeback goes without running
       * (holds.ts, `superseded`).
       */
      readonly superseded?: true;
    }
  | { readonly kind: "visibility"; readonly seconds: number }
  | { readonly kind: "none" };

export interface Processed {
  readonly action: Action;
  /** What to report to `onDelivery` listeners (nothing for a message addressed to another consumer or a hop). */
  readonly event?: Omit<VercelDeliveryEvent, "action" | "afterSeconds" | "applied">;
}

/** Checks a consumer against this transport where it is bound, so a configuration that could lose jobs fails at start. */
export function bindLane(
  config: VercelQueueConfig,
  api: LeaseApi,
  consumer: BoundConsumer,
  mode: "push" | "poll",
  maxDeliveries: number | undefined,
  retryAfterSeconds?: number,
): Lane {
  if (typeof consumer?.deliver !== "function") {
    throw new InvalidConfigError("the Vercel adapter takes a consumer from bindConsumer()");
  }
  const leaseMs = config.visibilityTimeoutSeconds * 1000;
  checkDeliveryBound(consumer, leaseMs, `the lease (visibilityTimeoutSeconds ${config.visibilityTimeoutSeconds} s)`);
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
    if (!config.regionFixed) {
      problems.push(
        `it needs a fixed region (options.region), not VERCEL_REGION (${config.region}): a message can be consumed only in the region it was sent to, and a function's region changes on failover`,
      );
    }
    if (config.deploymentId !== null) {
      problems.push(
        `it must consume unpinned (deploymentId: null), not as deployment ${config.deploymentId}: pinned, it would see only that deployment's messages and strand every other deployment's`,
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
    api,
    mode,
    maxDeliveries: cap,
    redeliverySeconds: mode === "push" ? (retryAfterSeconds ?? 60) : config.visibilityTimeoutSeconds,
  };
}

/**
 * The consumer's dead-letter alerts delivered or recorded, waited for at
 * most `ALERT_FLUSH_TIMEOUT_MS` (a hung alert sink must not hold a function
 * until its time limit); never throws.
 */
export async function flushAlerts(consumer: BoundConsumer, logger: Logger): Promise<void> {
  if (typeof consumer.flushAlerts !== "function") return;
  let timer: NodeJS.Timeout | undefined;
  try {
    const flushed = consumer.flushAlerts().then(() => true);
    const late = new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), ALERT_FLUSH_TIMEOUT_MS);
    });
    if (!(await Promise.race([flushed, late]))) {
      logger.warn(`${consumer.name}: dead-letter alerts not flushed within ${ALERT_FLUSH_TIMEOUT_MS} ms`);
    }
  } catch (thrown) {
    logger.warn(`${consumer.name}: dead-letter alerts not flushed: ${describeError(thrown)}`);
  } finally {
    clearTimeout(timer);
  }
}
