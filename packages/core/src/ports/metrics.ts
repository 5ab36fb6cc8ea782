import type { DeliveryOutcome } from "../queue-port.ts";

export interface JobMetricAttributes {
  readonly queue: string;
  readonly consumer: string;
  readonly outcome: DeliveryOutcome;
}

/**
 * Where the harness reports what happened: successes are metrics, not rows.
 * Calls are synchronous and on the hot path, so implementations must only
 * record (an OpenTelemetry counter add), never do I/O.
 */
export interface MetricsPort {
  /** One call per delivery. */
  jobProcessed(attributes: JobMetricAttributes): void;
  /** Wall time of the work transaction (fence + handler + commit), for deliveries that ran the handler. */
  handlerDuration(milliseconds: number, attributes: JobMetricAttributes): void;
  /** The alert sink threw or rejected. */
  alertFailed(attributes: { readonly queue: string; readonly consumer: string }): void;
  /**
   * Something went wrong between a transport adapter and its provider that
   * the job's outcome does not show (a failed acknowledgement, a lost lease,
   * an unconfirmed push callback, auth failures, a job rescued before the
   * provider would have dropped it). Optional: ports written before it count nothing.
   */
  transportIncident?(attributes: { readonly queue: string; readonly consumer: string; readonly kind: string }): void;
}

export const noopMetrics: MetricsPort = {
  jobProcessed() {},
  handlerDuration() {},
  alertFailed() {},
};
