/** Per-tenant fan-out of recurring work (#20 item 3, SPEC §7). */

export { type FanOutTask, fanOutCronRoute, runFanOutTick, scheduleFanOut, tickAt } from "./entry-points.ts";
export { type FanOutOptions, type FanOutReport, fanOut, type TenantSource } from "./fan-out.ts";
export { fanOutJobId } from "./job-id.ts";
export { TIERS, type Tier, tiersDue } from "./tiers.ts";
