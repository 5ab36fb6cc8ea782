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

/** `metrics`, with every call guarded (a class with plain methods: it runs twice per job, so no arrays or closures per call). */
export function guardedMetrics(metrics: MetricsPort, failures: ObserverFailures, logger: Logger): MetricsPort {
  return new GuardedMetrics(metrics, failures, logger);
}

class GuardedMetrics implements MetricsPort {
  readonly transportIncident?: NonNullable<MetricsPort["transportIncident"]>;
  constructor(
    private readonly metrics: MetricsPort,
    private readonly failures: ObserverFailures,
    private readonly logger: Logger,
  ) {
    if (metrics.transportIncident) {
      this.transportIncident = (attributes) => {
        try {
          this.#settled("transportIncident", metrics.transportIncident?.(attributes));
        } catch (thrown) {
          this.#failed("transportIncident", thrown);
        }
      };
    }
  }
  jobProcessed(attributes: Parameters<MetricsPort["jobProcessed"]>[0]): void {
    try {
      this.#settled("jobProcessed", this.metrics.jobProcessed(attributes));
    } catch (thrown) {
      this.#failed("jobProcessed", thrown);
    }
  }
  handlerDuration(milliseconds: number, attributes: Parameters<MetricsPort["handlerDuration"]>[1]): void {
    try {
      this.#settled("handlerDuration", this.metrics.handlerDuration(milliseconds, attributes));
    } catch (thrown) {
      this.#failed("handlerDuration", thrown);
    }
  }
  alertFailed(attributes: Parameters<MetricsPort["alertFailed"]>[0]): void {
    try {
      this.#settled("alertFailed", this.metrics.alertFailed(attributes));
    } catch (thrown) {
      this.#failed("alertFailed", thrown);
    }
  }
  /** A port that returns a promise (against its contract): its rejection is counted, never left unhandled. */
  #settled(method: string, result: unknown): void {
    if (isThenable(result)) result.then(undefined, (thrown: unknown) => this.#failed(method, thrown));
  }
  #failed(method: string, thrown: unknown): void {
    this.failures.metrics += 1;
    this.logger.warn(`metrics port ${method}() failed; the delivery's outcome stands`, { error: String(thrown) });
  }
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
