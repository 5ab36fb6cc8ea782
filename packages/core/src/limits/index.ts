/** Rate limits (#20, SPEC §7): declared on a consumer, taken by the harness before its work transaction. */
export { type Admission, RateGate } from "./gate.ts";
export { inProcessRateLimiter } from "./in-process.ts";
export { perTenant, provider, type RateLimit, type RateLimitSpec } from "./limits.ts";
export type { RateLimiter, TakeResult, TokenBucket } from "./port.ts";
