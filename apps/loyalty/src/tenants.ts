/**
 * The tenant port of the module's recurring jobs (#20 item 3): keyset pages
 * of `loyalty.tenants`, so a tick over 100,000 tenants holds one page in
 * memory at a time and each page is one index range read (ids after the
 * last one, in byte order — the column's collation is "C", the order the
 * fan-out checks its pages by).
 */
import { type AnyPgDatabase, type TenantSource, type Tier, tiersDue } from "@softcrum/core";
import { and, asc, gt, inArray, type SQL, sql } from "drizzle-orm";
import { tenants } from "./schema.ts";

/** The tenant id of a platform-wide job: not a tenant, one job per tick through the same fan-out and fence. */
export const PLATFORM_TENANT = "_platform";

function page(db: AnyPgDatabase, where: SQL | undefined, after: string | null, limit: number) {
  return db
    .select({ id: tenants.tenantId })
    .from(tenants)
    .where(and(where, after === null ? undefined : gt(tenants.tenantId, after)))
    .orderBy(asc(tenants.tenantId))
    .limit(limit)
    .then((rows) => rows.map((r) => r.id));
}

/** Every tenant. */
export function everyTenant(db: AnyPgDatabase): TenantSource {
  return ({ after, limit }) => page(db, undefined, after, limit);
}

/**
 * The tenants whose entitlement tier is due at the tick (`tiersDue`: every
 * tier at 00:00 UTC, `12h` and finer at 12:00, and so on). Read along the
 * primary key with the tier as a filter: one pass over the tenants per tick
 * whatever the tiers, with no second index for every tenant write to keep.
 */
export function tenantsDueAt(db: AnyPgDatabase): TenantSource {
  return ({ tick, after, limit }) => page(db, inArray(tenants.tier, tiersDue(tick)), after, limit);
}

/** The one "tenant" of a platform-wide task (a single job per tick). */
export const platformOnly: TenantSource = async ({ after }) => (after === null ? [PLATFORM_TENANT] : []);

/** Adds a tenant, or changes its tier (an entitlement change takes effect at the next tick). */
export async function upsertTenant(db: AnyPgDatabase, tenantId: string, tier: Tier = "nightly"): Promise<void> {
  await db
    .insert(tenants)
    .values({ tenantId, tier })
    .onConflictDoUpdate({ target: tenants.tenantId, set: { tier: sql`excluded.tier` } });
}
