/**
 * `@softcrum/core/alerts/betterstack`: dead-letter alerts to BetterStack
 * through @logtail/node (see docs/adr/0005-betterstack-alerts.md).
 *
 * One alert per new dead letter, with its ids, class, attempts and a short
 * error — never the payload. Identical failures (same queue, consumer, error
 * class and error fingerprint) inside a window produce the first alert and,
 * at the window's end, one summary with how many more there were, not a
 * storm. The SDK resolves even when it dropped a log, so it runs with
 * `throwExceptions` and a failed delivery is counted and logged here; it never
 * blocks the harness or loses the dead-letter row (the row is the evidence).
 */
import { createHash } from "node:crypto";
import { Logtail } from "@logtail/node";
import { InvalidConfigError } from "../../errors.ts";
import type { AlertPort, DeadLetterAlert } from "../../ports/alerts.ts";
import { consoleLogger, type Logger } from "../../ports/logger.ts";
import type { MetricsPort } from "../../ports/metrics.ts";

export interface BetterStackAlertOptions {
  /** The BetterStack (Logtail) source token. */
  readonly sourceToken: string;
  /** Ingest URL, used verbatim. @default the SDK's (https://in.logs.betterstack.com) */
  readonly endpoint?: string;
  /** How long identical failures are folded into one alert. @default 300_000 (5 min) */
  readonly coalesceWindowMs?: number;
  /** Passed to the SDK (batchInterval, retryCount, …); throwExceptions is always on. */
  readonly sdkOptions?: Record<string, unknown>;
  /** Counts failed deliveries (`alertFailed`). @default none */
  readonly metrics?: Pick<MetricsPort, "alertFailed">;
  /** @default console */
  readonly logger?: Logger;
  /** @default Date.now */
  readonly now?: () => number;
}

export interface BetterStackAlerts extends AlertPort {
  /** Sends pending summaries and waits for everything queued to be delivered (or to fail). */
  flush(): Promise<void>;
  /** flush(), then stop the window timers. */
  close(): Promise<void>;
  /** Deliveries that failed so far. */
  readonly failed: number;
}

interface Window {
  readonly first: DeadLetterAlert;
  readonly fingerprint: string;
  readonly startedAt: number;
  suppressed: number;
  timer: NodeJS.Timeout;
}

/**
 * The same failure with other ids, numbers or quoted values has the same
 * fingerprint: "order 123 not found" and "order 456 not found" coalesce.
 */
export function errorFingerprint(error: string): string {
  const shape = error
    .toLowerCase()
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "<id>")
    .replace(/(["'`]).*?\1/g, "<s>")
    .replace(/\d+/g, "<n>")
    .replace(/\s+/g, " ")
    .trim();
  return createHash("sha256").update(shape).digest("hex").slice(0, 16);
}

export function createBetterStackAlerts(options: BetterStackAlertOptions): BetterStackAlerts {
  if (typeof options.sourceToken !== "string" || options.sourceToken.trim() === "") {
    throw new InvalidConfigError("BetterStack alerts: sourceToken is required (the source's token from BetterStack)");
  }
  const windowMs = options.coalesceWindowMs ?? 300_000;
  if (!Number.isFinite(windowMs) || windowMs < 0) {
    throw new InvalidConfigError(`BetterStack alerts: coalesceWindowMs must be >= 0, got ${windowMs}`);
  }
  const logger = options.logger ?? consoleLogger;
  const now = options.now ?? Date.now;
  const logtail = new Logtail(options.sourceToken, {
    captureStackContext: false,
    ...options.sdkOptions,
    ...(options.endpoint ? { endpoint: options.endpoint } : {}),
    throwExceptions: true,
    ignoreExceptions: false,
  });
  const windows = new Map<string, Window>();
  const inFlight = new Set<Promise<unknown>>();
  let failed = 0;

  const send = (message: string, context: Record<string, unknown>, about: DeadLetterAlert) => {
    const delivery = logtail.error(message, context).then(
      () => undefined,
      (error: unknown) => {
        failed += 1;
        options.metrics?.alertFailed({ queue: about.queue, consumer: about.consumer });
        logger.warn(`BetterStack alert not delivered: ${error instanceof Error ? error.message : String(error)}`, {
          deadLetterId: about.deadLetterId,
        });
      },
    );
    inFlight.add(delivery);
    void delivery.finally(() => inFlight.delete(delivery));
  };

  const closeWindow = (key: string) => {
    const window = windows.get(key);
    if (!window) return;
    windows.delete(key);
    clearTimeout(window.timer);
    if (window.suppressed === 0) return;
    const { first } = window;
    send(
      `${window.suppressed} more dead letters like ${first.deadLetterId}: ${first.errorClass} in ${first.consumer} (${first.queue})`,
      {
        softcrum_alert: "dead_letters_coalesced",
        count: window.suppressed,
        window_ms: now() - window.startedAt,
        first_dead_letter_id: first.deadLetterId,
        queue: first.queue,
        consumer: first.consumer,
        error_class: first.errorClass,
        error_fingerprint: window.fingerprint,
        error: first.error,
      },
      first,
    );
  };

  return {
    get failed() {
      return failed;
    },
    deadLetterCreated(alert) {
      const fingerprint = errorFingerprint(alert.error);
      const key = [alert.queue, alert.consumer, alert.errorClass, fingerprint].join("\u0000");
      const open = windows.get(key);
      if (open) {
        open.suppressed += 1;
        return;
      }
      send(
        `dead letter: ${alert.errorClass} in ${alert.consumer} (${alert.queue})`,
        {
          softcrum_alert: "dead_letter",
          dead_letter_id: alert.deadLetterId,
          job_id: alert.jobId,
          queue: alert.queue,
          consumer: alert.consumer,
          tenant_id: alert.tenantId,
          kind: alert.kind,
          correlation_id: alert.correlationId,
          error_class: alert.errorClass,
          attempts: alert.attempts,
          error: alert.error,
          error_fingerprint: fingerprint,
        },
        alert,
      );
      if (windowMs > 0) {
        const timer = setTimeout(() => closeWindow(key), windowMs);
        timer.unref();
        windows.set(key, { first: alert, fingerprint, startedAt: now(), suppressed: 0, timer });
      }
    },
    async flush() {
      for (const key of [...windows.keys()]) closeWindow(key);
      await Promise.allSettled([...inFlight]);
      await logtail.flush().catch(() => {});
      await Promise.allSettled([...inFlight]);
    },
    async close() {
      await this.flush();
    },
  };
}
