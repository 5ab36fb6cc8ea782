// `@softcrum/core/maintenance`: scheduled upkeep of the job tables.
export type { CleanupReport, FenceCleanup, FenceCleanupOptions } from "./fence-cleanup.ts";
export { checkFenceTtl, createFenceCleanup, scheduleFenceCleanup } from "./fence-cleanup.ts";
