/**
 * `@softcrum/core/metrics/opentelemetry`: the harness's and the operations'
 * metrics through the OpenTelemetry API (no-op until the application
 * installs an SDK MeterProvider). Names follow the OpenTelemetry semantic
 * conventions for messaging where one exists (`messaging.process.duration`,
 * `messaging.destination.name`, `messaging.consumer.group.name`); the rest are
 * `softcrum.*`. The README lists every instrument.
 */
import { type Attributes, type Meter, metrics } from "@opentelemetry/api";
import type { BatchRecoveryReport, OpsMetricsPort } from "../../ops/operations.ts";
import type { JobMetricAttributes, MetricsPort } from "../../ports/metrics.ts";

export interface OtelMetricsOptions {
  /** @default metrics.getMeter("@softcrum/core") from the global MeterProvider */
  readonly meter?: Meter;
  /**
   * Reads dead-letter depth for the observable gauges, e.g.
   * `() => ops.deadLetters.depth()`. Called at each collection. @default no gauges
   */
  readonly deadLetterDepth?: () => Promise<
    readonly { queue: string; consumer: string; pending: number; oldestPendingAgeMs: number }[]
  >;
}

export interface OtelMetrics extends MetricsPort, OpsMetricsPort {
  /** Counted as `softcrum.transport.incident`, by kind. */
  transportIncident(attributes: { readonly queue: string; readonly consumer: string; readonly kind: string }): void;
  /** Recorded as `softcrum.replay_batch.jobs` by state and `softcrum.replay_batch.time_to_recovery`. */
  batchRecovery(report: BatchRecoveryReport): void;
  /** Stops observing dead-letter depth. */
  close(): void;
}

const SYSTEM = "softcrum";

function jobAttributes(a: { queue: string; consumer: string }): Attributes {
  return {
    "messaging.system": SYSTEM,
    "messaging.destination.name": a.queue,
    "messaging.consumer.group.name": a.consumer,
  };
}

export function createOtelMetrics(options: OtelMetricsOptions = {}): OtelMetrics {
  const meter = options.meter ?? metrics.getMeter("@softcrum/core");
  const processed = meter.createCounter("softcrum.job.processed", {
    description: "Deliveries handled by the consumer harness, by outcome",
    unit: "{delivery}",
  });
  const duration = meter.createHistogram("messaging.process.duration", {
    description: "Duration of the work transaction (fence, handler, commit)",
    unit: "s",
  });
  const alertFailed = meter.createCounter("softcrum.alert.failed", {
    description: "Dead-letter alerts that could not be delivered",
    unit: "{alert}",
  });
  const transportIncidents = meter.createCounter("softcrum.transport.incident", {
    description:
      "Transport incidents the job outcome does not show (failed acks, lost leases, rescues, auth failures), by kind",
    unit: "{incident}",
  });
  const replayed = meter.createCounter("softcrum.dead_letter.replayed", {
    description: "Dead letters republished by operators",
    unit: "{letter}",
  });
  const failedAgain = meter.createCounter("softcrum.dead_letter.failed_again", {
    description: "Replayed jobs that failed again",
    unit: "{job}",
  });
  const batchJobs = meter.createGauge("softcrum.replay_batch.jobs", {
    description:
      "A replay batch's jobs when a run of it ends, by state: replayed, succeeded, failed_again, in_flight, duplicates",
    unit: "{job}",
  });
  const batchRecovery = meter.createGauge("softcrum.replay_batch.time_to_recovery", {
    description: "From a replay batch's start until its last replayed job resolved",
    unit: "s",
  });
  const depth = meter.createObservableGauge("softcrum.dead_letter.depth", {
    description: "Dead letters pending review",
    unit: "{letter}",
  });
  const oldest = meter.createObservableGauge("softcrum.dead_letter.oldest_age", {
    description: "Age of the oldest dead letter pending review",
    unit: "s",
  });

  const readDepth = options.deadLetterDepth;
  // Every (queue, consumer) ever observed: once its last letter is resolved it
  // must read 0, not keep its last value (an alert on depth > 0 would never clear).
  const seen = new Map<string, { queue: string; consumer: string }>();
  const observe = readDepth
    ? async (observer: import("@opentelemetry/api").BatchObservableResult) => {
        // One query feeds both gauges; a failed read reports nothing rather than zeros.
        const rows = await readDepth();
        const current = new Set<string>();
        for (const row of rows) {
          const key = `${row.queue}\u0000${row.consumer}`;
          current.add(key);
          seen.set(key, { queue: row.queue, consumer: row.consumer });
          const attributes = jobAttributes(row);
          observer.observe(depth, row.pending, attributes);
          observer.observe(oldest, row.oldestPendingAgeMs / 1000, attributes);
        }
        for (const [key, pair] of seen) {
          if (current.has(key)) continue;
          observer.observe(depth, 0, jobAttributes(pair));
          observer.observe(oldest, 0, jobAttributes(pair));
        }
      }
    : undefined;
  if (observe) meter.addBatchObservableCallback(observe, [depth, oldest]);

  return {
    jobProcessed(a: JobMetricAttributes) {
      processed.add(1, { ...jobAttributes(a), "softcrum.job.outcome": a.outcome });
    },
    handlerDuration(ms: number, a: JobMetricAttributes) {
      duration.record(ms / 1000, {
        ...jobAttributes(a),
        "messaging.operation.name": "process",
        "softcrum.job.outcome": a.outcome,
      });
    },
    alertFailed(a) {
      alertFailed.add(1, jobAttributes(a));
    },
    transportIncident(a) {
      transportIncidents.add(1, { ...jobAttributes(a), "softcrum.transport.incident": a.kind });
    },
    replayed(a) {
      replayed.add(1, jobAttributes(a));
    },
    failedAgain(count) {
      failedAgain.add(count, { "messaging.system": SYSTEM });
    },
    batchRecovery(report) {
      const batch = { "messaging.system": SYSTEM, "softcrum.replay_batch.id": report.batchId };
      for (const [state, n] of [
        ["replayed", report.replayed],
        ["succeeded", report.succeeded],
        ["failed_again", report.failedAgain],
        ["in_flight", report.inFlight],
        ["duplicates", report.duplicates],
      ] as const) {
        batchJobs.record(n, { ...batch, "softcrum.replay_batch.state": state });
      }
      if (report.timeToRecoveryMs !== null) batchRecovery.record(report.timeToRecoveryMs / 1000, batch);
    },
    close() {
      if (observe) meter.removeBatchObservableCallback(observe, [depth, oldest]);
    },
  };
}
