// `@softcrum/core/maintenance`: scheduled upkeep of the job tables.
export type { CleanupReport, FenceCleanup, FenceCleanupOptions, FenceTtlConsumer } from "./fence-cleanup.ts";
export { checkFenceTtl, createFenceCleanup, minimumFenceTtlMs, scheduleFenceCleanup } from "./fence-cleanup.ts";
export type {
  DroppedPartitionsReport,
  EnsureFencePartitionsOptions,
  FencePartitionsReport,
} from "./fence-partitions.ts";
export { ensureFencePartitions } from "./fence-partitions.ts";
export type { FenceCleanupScheduleOptions } from "./fence-schedule.ts";
