// `@softcrum/core/maintenance`: scheduled upkeep of the job tables.
export type { CleanupReport, FenceCleanup, FenceCleanupOptions, FenceTtlConsumer } from "./fence-cleanup.ts";
export { checkFenceTtl, createFenceCleanup, minimumFenceTtlMs, scheduleFenceCleanup } from "./fence-cleanup.ts";
