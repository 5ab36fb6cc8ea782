/** Notification lanes (#20 item 2, SPEC §7). */
export { LANES, type Lane, laneQueue, parseLaneQueue } from "./names.ts";
