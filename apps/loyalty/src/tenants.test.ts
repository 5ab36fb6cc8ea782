/**
 * #20 item 3: the tenant port of the recurring jobs — keyset pages of
 * loyalty.tenants, by entitlement tier for the freshness recompute.
 */
import { type TenantSource, TIERS, type Tier } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { beforeEach, describe, expect, test } from "vitest";
import { everyTenant, PLATFORM_TENANT, platformOnly, tenantsDueAt, upsertTenant } from "./tenants.ts";

const pg = useModuleDatabase("loyalty-tenants");

beforeEach(async () => {
  await pg.sql`truncate loyalty.tenants`;
});

const at = (hourUtc: number) => new Date(Date.UTC(2026, 11, 2, hourUtc));

/** Every page of a source for `tick`, as the fan-out reads them. */
async function readAll(source: TenantSource, tick: Date, limit: number) {
  const pages: (readonly string[])[] = [];
  let after: string | null = null;
  for (;;) {
    const page = await source({ tick, after, limit });
    pages.push(page);
    if (page.length < limit) return { ids: pages.flat(), pages };
    after = page[page.length - 1] as string;
  }
}

describe("the tenant sources", () => {
  test("tenantsDueAt selects the tiers due at the tick: every tier at 00:00, 12h and finer at 12:00, 3h and 1h at 03:00, 1h alone at 01:00", async () => {
    for (const tier of TIERS) {
      for (const n of [1, 2]) await upsertTenant(pg.db, `${tier}-${n}`, tier);
    }
    const due = async (hour: number) => (await readAll(tenantsDueAt(pg.db), at(hour), 3)).ids;
    const of = (...tiers: Tier[]) => tiers.flatMap((t) => [`${t}-1`, `${t}-2`]).sort();
    expect(await due(0)).toEqual(of("nightly", "12h", "6h", "3h", "1h"));
    expect(await due(12)).toEqual(of("12h", "6h", "3h", "1h"));
    expect(await due(3)).toEqual(of("3h", "1h"));
    expect(await due(1)).toEqual(of("1h"));
    // An entitlement change counts from the next tick on.
    await upsertTenant(pg.db, "nightly-1", "1h");
    expect(await due(1)).toEqual([...of("1h"), "nightly-1"].sort());
  });

  test("keyset pages: 1,234 tenants in pages of at most 500, each once, in the byte order the fan-out checks, whatever the database's locale", async () => {
    await pg.sql`
      insert into loyalty.tenants (tenant_id, tier)
      select 't-' || lpad(i::text, 5, '0'), (array['nightly','12h','6h','3h','1h'])[1 + i % 5]
        from generate_series(1, 1229) i`;
    // A locale collation orders these otherwise (en_US: "ab" before "a-c"); the column is collated "C".
    for (const id of ["a-c", "ab", "a_b", "Ab", "é"]) await upsertTenant(pg.db, id);
    const { ids, pages } = await readAll(everyTenant(pg.db), at(0), 500);
    expect(pages.map((p) => p.length)).toEqual([500, 500, 234]);
    expect(ids).toHaveLength(1_234);
    expect(new Set(ids).size).toBe(1_234);
    expect(ids).toEqual([...ids].sort());
    const [column] = await pg.sql<{ collation_name: string }[]>`
      select collation_name from information_schema.columns
       where table_schema = 'loyalty' and table_name = 'tenants' and column_name = 'tenant_id'`;
    expect(column?.collation_name).toBe("C");
  });

  test("a tier outside the entitlement tiers is refused by the table", async () => {
    await expect(pg.sql`insert into loyalty.tenants (tenant_id, tier) values ('acme', '2h')`).rejects.toThrow(
      /tenants_tier_check/,
    );
  });

  test("a platform-wide task has one tenant, whatever the tick", async () => {
    expect((await readAll(platformOnly, at(0), 500)).ids).toEqual([PLATFORM_TENANT]);
    expect((await readAll(platformOnly, at(7), 1)).pages).toEqual([[PLATFORM_TENANT], []]);
  });
});
