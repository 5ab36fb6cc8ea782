/**
 * Dependency strain, a stop condition of replay batches (seed 002, #21
 * item 5): a batch pauses itself when, during the batch, its consumers'
 * rate-limited outcomes (per delivery) or their handler p95 latency exceed
 * a multiple of the live baseline measured before the batch started.
 *
 * The signal comes from where the consumers run: a `StrainRecorder` is a
 * `MetricsPort` the composition root gives its consumers (beside its own
 * metrics: `teeMetrics`), and the `StrainMonitor` the operations read.
 * Without a monitor the condition is not checked (the runner says so once).
 */
import type { Clock } from "../clock.ts";
import { systemClock } from "../clock.ts";
import type { JobMetricAttributes, MetricsPort } from "../ports/metrics.ts";

/** What the consumers of a batch did over a time range. */
export interface ConsumerStrain {
  /** Deliveries that finished (any outcome). */
  readonly deliveries: number;
  /** Of those, `rate_limited` outcomes: a dependency said "slow down". */
  readonly rateLimited: number;
  /** The handlers' p95 duration in ms; null with fewer than `MIN_LATENCY_SAMPLES` runs. */
  readonly p95Ms: number | null;
}

/** Where a batch runner reads its consumers' strain. */
export interface StrainMonitor {
  strain(consumers: readonly string[], fromMs: number, toMs: number): ConsumerStrain | Promise<ConsumerStrain>;
}

/** Handler runs a p95 needs before it says anything. */
export const MIN_LATENCY_SAMPLES = 20;
/** Rate-limited outcomes during a batch below which it never pauses for them. */
export const MIN_RATE_LIMITED = 5;
/** How far back, before a batch starts, its baseline is measured. */
export const BASELINE_WINDOW_MS = 5 * 60_000;
/** The default multiples of the baseline a batch may reach before it pauses. */
export const DEFAULT_MAX_RATE_LIMITED_MULTIPLE = 3;
export const DEFAULT_MAX_LATENCY_MULTIPLE = 3;

/** A `MetricsPort` that remembers recent outcomes and durations per consumer, and a monitor over them. */
export interface StrainRecorder extends StrainMonitor {
  readonly metrics: MetricsPort;
}

/**
 * Records, per consumer, the outcome and handler duration of each delivery
 * for `keepMs` (at most `maxSamples` each, oldest dropped): O(1) on the hot
 * path, no I/O.
 */
export function strainRecorder(options: { clock?: Clock; keepMs?: number; maxSamples?: number } = {}): StrainRecorder {
  const clock = options.clock ?? systemClock;
  const keepMs = options.keepMs ?? 2 * BASELINE_WINDOW_MS;
  const maxSamples = options.maxSamples ?? 50_000;
  const outcomes = new Map<string, { at: number; rateLimited: boolean }[]>();
  const durations = new Map<string, { at: number; ms: number }[]>();
  const push = <T extends { at: number }>(map: Map<string, T[]>, consumer: string, sample: T) => {
    const list = map.get(consumer) ?? [];
    if (list.length === 0) map.set(consumer, list);
    list.push(sample);
    // Amortised: trim in bulk once a tenth over the bounds.
    if (list.length > maxSamples * 1.1 || (list[0] as T).at < sample.at - keepMs * 1.1) {
      const cutoff = sample.at - keepMs;
      const keep = list.filter((s) => s.at >= cutoff).slice(-maxSamples);
      map.set(consumer, keep);
    }
  };
  return {
    metrics: {
      jobProcessed(attributes: JobMetricAttributes) {
        push(outcomes, attributes.consumer, { at: clock.now(), rateLimited: attributes.outcome === "rate_limited" });
      },
      handlerDuration(ms: number, attributes: JobMetricAttributes) {
        push(durations, attributes.consumer, { at: clock.now(), ms });
      },
      alertFailed() {},
    },
    strain(consumers, fromMs, toMs) {
      let deliveries = 0;
      let rateLimited = 0;
      const ms: number[] = [];
      for (const consumer of consumers) {
        for (const o of outcomes.get(consumer) ?? []) {
          if (o.at < fromMs || o.at > toMs) continue;
          deliveries += 1;
          if (o.rateLimited) rateLimited += 1;
        }
        for (const d of durations.get(consumer) ?? []) if (d.at >= fromMs && d.at <= toMs) ms.push(d.ms);
      }
      return { deliveries, rateLimited, p95Ms: percentile95(ms) };
    },
  };
}

/** Both ports get every call: the composition root's own metrics and a strain recorder. */
export function teeMetrics(...ports: readonly MetricsPort[]): MetricsPort {
  return {
    jobProcessed: (a) => {
      for (const p of ports) p.jobProcessed(a);
    },
    handlerDuration: (ms, a) => {
      for (const p of ports) p.handlerDuration(ms, a);
    },
    alertFailed: (a) => {
      for (const p of ports) p.alertFailed(a);
    },
    transportIncident: (a) => {
      for (const p of ports) p.transportIncident?.(a);
    },
  };
}

function percentile95(values: number[]): number | null {
  if (values.length < MIN_LATENCY_SAMPLES) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.95) - 1)] as number;
}

/**
 * Why a batch should pause for its consumers' strain during the batch
 * compared with the baseline before it, or undefined. Rate-limited outcomes
 * count per delivery; with no baseline rate (none were limited before),
 * `MIN_RATE_LIMITED` of them during the batch is strain.
 */
export function strainReason(
  baseline: ConsumerStrain,
  during: ConsumerStrain,
  limits: { readonly maxRateLimitedMultiple: number; readonly maxLatencyMultiple: number },
): string | undefined {
  if (during.rateLimited >= MIN_RATE_LIMITED && during.deliveries > 0) {
    const share = during.rateLimited / during.deliveries;
    const before = baseline.deliveries > 0 ? baseline.rateLimited / baseline.deliveries : 0;
    if (share > before * limits.maxRateLimitedMultiple) {
      const pct = (x: number) => `${Math.round(x * 1000) / 10}%`;
      return `dependency strain: ${during.rateLimited} of ${during.deliveries} deliveries rate-limited during the batch (${pct(share)}), over ${limits.maxRateLimitedMultiple} × the ${pct(before)} before it`;
    }
  }
  if (during.p95Ms !== null && baseline.p95Ms !== null && during.p95Ms > baseline.p95Ms * limits.maxLatencyMultiple) {
    return `dependency strain: handler p95 ${Math.round(during.p95Ms)} ms during the batch, over ${limits.maxLatencyMultiple} × the ${Math.round(baseline.p95Ms)} ms before it`;
  }
  return undefined;
}
