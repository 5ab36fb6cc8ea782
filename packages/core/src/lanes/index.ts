/** Notification lanes (#20 item 2, SPEC §7; ADR 0011). */
export {
  DEFAULT_LANE_BACKLOG_STALE_AFTER_MS,
  type InProcessLaneBacklogOptions,
  inProcessLaneBacklog,
  type LaneBacklog,
  type LaneBacklogEntry,
} from "./backlog.ts";
export { type LaneAdmission, LaneGate, YIELD_BASE_MS, YIELD_CAP_MS } from "./gate.ts";
export { LANES, type Lane, laneQueue, parseLaneQueue } from "./names.ts";
export { type CountTransactionalOptions, countTransactional } from "./publish.ts";
