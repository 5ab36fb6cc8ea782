/**
 * Observers never change an outcome (#18 item 4). The metrics port and the
 * logger are called on the delivery's own path, after its outcome is decided
 * (a commit, a letter written): one that throws must not turn a committed job
 * into a thrown delivery — which the transport redelivers as a duplicate that
 * throws again, forever — nor a poison letter into an endless upsert. So the
 * harness calls them only through these guards: a throw (or a rejected
 * promise, for a port that returns one) is caught and counted, never
 * propagated, and nothing the harness does waits for an observer.
 */
import type { Logger } from "./logger.ts";
import type { MetricsPort } from "./metrics.ts";

/** Failures of the observers of one bound consumer, counted. */
export class ObserverFailures {
  metrics = 0;
  logger = 0;
}

/** `metrics`, with every call guarded. */
export function guardedMetrics(metrics: MetricsPort, failures: ObserverFailures, logger: Logger): MetricsPort {
  const failed = (method: string, thrown: unknown) => {
    failures.metrics += 1;
    logger.warn(`metrics port ${method}() failed; the delivery's outcome stands`, { error: String(thrown) });
  };
  const call =
    <A extends unknown[]>(method: keyof MetricsPort, fn: ((...args: A) => unknown) | undefined) =>
    (...args: A): void => {
      try {
        const result = fn?.apply(metrics, args);
        if (isThenable(result)) result.then(undefined, (thrown: unknown) => failed(method, thrown));
      } catch (thrown) {
        failed(method, thrown);
      }
    };
  return {
    jobProcessed: call("jobProcessed", metrics.jobProcessed),
    handlerDuration: call("handlerDuration", metrics.handlerDuration),
    alertFailed: call("alertFailed", metrics.alertFailed),
    ...(metrics.transportIncident ? { transportIncident: call("transportIncident", metrics.transportIncident) } : {}),
  };
}

/** `logger`, with every call guarded (a logger that throws is counted, and silent). */
export function guardedLogger(logger: Logger, failures: ObserverFailures): Logger {
  const call =
    (fn: Logger["warn"]) =>
    (message: string, fields?: Record<string, unknown>): void => {
      try {
        const result: unknown = fn.call(logger, message, fields);
        if (isThenable(result)) result.then(undefined, () => (failures.logger += 1));
      } catch {
        failures.logger += 1;
      }
    };
  return { warn: call(logger.warn), error: call(logger.error) };
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as { then?: unknown } | null | undefined)?.then === "function";
}
