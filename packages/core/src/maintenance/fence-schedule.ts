/** The fence cleanup on a schedule: partition pre-creation, then the cleanup, every interval. */
import { InvalidConfigError } from "../errors.ts";
import { MAX_TIMER_DELAY_MS } from "../timers.ts";
import type { CleanupReport, FenceCleanup } from "./fence-cleanup-types.ts";
import type { FencePartitionsReport } from "./fence-partitions.ts";

export interface FenceCleanupScheduleOptions {
  readonly intervalMs: number;
  readonly onRun?: (report: CleanupReport) => void;
  /** What each run's partition pre-creation did (`FenceCleanup.ensurePartitions`). */
  readonly onPartitions?: (report: FencePartitionsReport) => void;
  /** A failed pre-creation or run; the next interval tries again. */
  readonly onError?: (error: unknown) => void;
}

/**
 * Runs the cleanup every `intervalMs` until stopped; a failed run is reported
 * and the next one tries again. Runs never overlap. Before each run the day
 * partitions ahead are created (`ensurePartitions`, when the cleanup has it);
 * its failure is reported and the cleanup runs anyway (fences of a day without
 * a partition go to the default partition, which the batches clean).
 */
export function scheduleFenceCleanup(
  cleanup: FenceCleanup,
  options: FenceCleanupScheduleOptions,
): { stop(): Promise<void> } {
  if (!Number.isFinite(options.intervalMs) || options.intervalMs <= 0 || options.intervalMs > MAX_TIMER_DELAY_MS) {
    throw new InvalidConfigError(
      `fence cleanup schedule: intervalMs must be positive and at most ${MAX_TIMER_DELAY_MS} ms (a timer's limit), got ${options.intervalMs}`,
    );
  }
  const controller = new AbortController();
  // A throwing callback must not become an unhandled rejection, nor stop the run.
  const report = (callback: (() => void) | undefined) => {
    try {
      callback?.();
    } catch {}
  };
  let running: Promise<void> | undefined;
  const once = async () => {
    if (cleanup.ensurePartitions && !controller.signal.aborted) {
      await cleanup.ensurePartitions().then(
        (r) => report(() => options.onPartitions?.(r)),
        (e: unknown) => report(() => options.onError?.(e)),
      );
    }
    await cleanup.run({ signal: controller.signal }).then(
      (r) => report(() => options.onRun?.(r)),
      (e: unknown) => report(() => options.onError?.(e)),
    );
  };
  const timer = setInterval(() => {
    if (running) return; // the previous run is still going
    running = once()
      .catch(() => {})
      .finally(() => {
        running = undefined;
      });
  }, options.intervalMs);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      controller.abort();
      await running;
    },
  };
}
