/**
 * Where this module's e-mail goes and how fast (SPEC §7): one queue per lane
 * of the `email` channel, and one Resend bucket for both lanes — Resend's
 * limit is per team, so every consumer that calls it takes from the same
 * provider bucket, in every process (with the Upstash limiter).
 */
import { laneQueue, perTenant, provider, type RateLimit, type RateLimitSpec } from "@softcrum/core";

export const EMAIL_MARKETING_QUEUE = laneQueue("email", "marketing");
export const EMAIL_TRANSACTIONAL_QUEUE = laneQueue("email", "transactional");

/** Resend's default team limit, as its docs and our plan say: 10 requests a second. */
export const RESEND_RATE: RateLimitSpec = { rate: 10, per: "1s" };
/** One tenant's fair share of it, per consumer: no tenant's blast takes the whole team budget. */
export const TENANT_EMAIL_RATE: RateLimitSpec = { rate: 5, per: "1s" };

export interface EmailLimitOptions {
  /** The provider's bucket; give every consumer the same one. @default RESEND_RATE (10/s) */
  readonly resendRate?: RateLimitSpec;
  /** Each tenant's bucket, per consumer. @default TENANT_EMAIL_RATE (5/s) */
  readonly tenantRate?: RateLimitSpec;
}

export function emailLimits(options: EmailLimitOptions = {}): readonly RateLimit[] {
  return [provider("resend", options.resendRate ?? RESEND_RATE), perTenant(options.tenantRate ?? TENANT_EMAIL_RATE)];
}
