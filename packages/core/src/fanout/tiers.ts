/**
 * Entitlement tiers of recurring per-tenant work (seed 001): how often a
 * tenant's freshness recompute runs — nightly, every 12 h, 6 h, 3 h or 1 h.
 * A tick on the hour selects the tenants whose tier is due at it (UTC):
 * every tier at midnight, `12h` and finer at noon, and so on.
 */
import { InvalidConfigError } from "../errors.ts";

export const TIERS = ["nightly", "12h", "6h", "3h", "1h"] as const;
export type Tier = (typeof TIERS)[number];

const PERIOD_HOURS: Record<Tier, number> = { nightly: 24, "12h": 12, "6h": 6, "3h": 3, "1h": 1 };

/** The tiers due at `tick`, which must fall on the hour (UTC). */
export function tiersDue(tick: Date): Tier[] {
  const ms = tick instanceof Date ? tick.getTime() : Number.NaN;
  if (!Number.isFinite(ms) || ms % 3_600_000 !== 0) {
    throw new InvalidConfigError(`tiersDue: a tick falls on the hour (UTC), got ${String(tick)}`);
  }
  const hour = tick.getUTCHours();
  return TIERS.filter((tier) => hour % PERIOD_HOURS[tier] === 0);
}
