import { TIERS } from "@softcrum/core";
import { sql } from "drizzle-orm";
import {
  bigint,
  bigserial,
  check,
  customType,
  index,
  integer,
  pgSchema,
  primaryKey,
  text,
  timestamp,
  uuid,
} from "drizzle-orm/pg-core";

/** The example module owns the `loyalty` schema; @softcrum/core owns `core`. */
export const loyalty = pgSchema("loyalty");

const at = (name: string) => timestamp(name, { withTimezone: true });

/** One row per credit: the effect a duplicate delivery must never repeat. */
export const ledger = loyalty.table(
  "ledger",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    jobId: uuid("job_id").notNull(),
    tenantId: text("tenant_id").notNull(),
    customerId: text("customer_id").notNull(),
    points: integer("points").notNull(),
    reason: text("reason").notNull(),
    createdAt: at("created_at").notNull().defaultNow(),
    /** When the credit's points lapse (POINTS_VALID_DAYS after the credit); null: never (rows from before it existed). */
    expiresAt: at("expires_at"),
  },
  (t) => [
    index("ledger_customer_idx").on(t.tenantId, t.customerId),
    // The recurring jobs read a tenant's credits by time: a snapshot's window, the retention cutoff, expiry.
    index("ledger_created_idx").on(t.tenantId, t.createdAt),
    index("ledger_expires_idx").on(t.tenantId, t.expiresAt),
  ],
);

/** Running balance per customer, updated in the same transaction as the ledger row. */
export const balances = loyalty.table(
  "balances",
  {
    tenantId: text("tenant_id").notNull(),
    customerId: text("customer_id").notNull(),
    points: integer("points").notNull(),
    updatedAt: at("updated_at").notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.customerId] })],
);

/**
 * Tenant ids compared byte by byte (collation "C") whatever the database's
 * locale: the fan-out reads tenants in keyset pages and checks that each page
 * moves forward in JavaScript's string order, which a locale collation
 * (en_US puts "ab" before "a-c") would contradict.
 */
const byteOrderedText = customType<{ data: string; driverData: string }>({ dataType: () => 'text COLLATE "C"' });

/**
 * The tenants of the module: the port its recurring jobs fan out over, and
 * each tenant's entitlement tier (how often its freshness recompute runs).
 */
export const tenants = loyalty.table(
  "tenants",
  {
    tenantId: byteOrderedText("tenant_id").primaryKey(),
    tier: text("tier", { enum: TIERS }).notNull().default("nightly"),
    createdAt: at("created_at").notNull().defaultNow(),
  },
  (t) => [check("tenants_tier_check", sql`${t.tier} in (${sql.raw(TIERS.map((x) => `'${x}'`).join(", "))})`)],
);

/** The freshness recompute's read model: one row per tenant, recomputed at the tenant's tier. */
export const tenantStats = loyalty.table("tenant_stats", {
  tenantId: text("tenant_id").primaryKey(),
  customers: integer("customers").notNull(),
  points: bigint("points", { mode: "number" }).notNull(),
  lastCreditAt: at("last_credit_at"),
  /** The tick it was recomputed for: an older tick never overwrites a newer one. */
  computedFor: at("computed_for").notNull(),
  computedAt: at("computed_at").notNull().defaultNow(),
});

/**
 * Consumption every 30 minutes, per tenant: the credits of the window that
 * ends at `taken_at`. Partitioned by month on `taken_at` (the migration says
 * so; drizzle-kit has no syntax for it): 100,000 tenants write 4.8 M rows a
 * day, and a month past retention goes with one DROP (recurring-jobs.ts).
 */
export const consumptionSnapshots = loyalty.table(
  "consumption_snapshots",
  {
    tenantId: text("tenant_id").notNull(),
    takenAt: at("taken_at").notNull(),
    credits: integer("credits").notNull(),
    points: bigint("points", { mode: "number" }).notNull(),
    customers: integer("customers").notNull(),
  },
  // The partition key must be part of the primary key.
  (t) => [primaryKey({ columns: [t.tenantId, t.takenAt] })],
);

/** One row per tenant per nightly reconciliation: that it ran, over how many customers, how many disagreed. */
export const reconciliations = loyalty.table(
  "reconciliations",
  {
    tenantId: text("tenant_id").notNull(),
    checkedAt: at("checked_at").notNull(),
    customers: integer("customers").notNull(),
    discrepancies: integer("discrepancies").notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.checkedAt] })],
);

/** A customer whose balance is not the sum of their credits (rolled-up ones included); null: no row on that side. */
export const reconciliationDiscrepancies = loyalty.table(
  "reconciliation_discrepancies",
  {
    tenantId: text("tenant_id").notNull(),
    checkedAt: at("checked_at").notNull(),
    customerId: text("customer_id").notNull(),
    balance: bigint("balance", { mode: "number" }),
    expected: bigint("expected", { mode: "number" }),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.checkedAt, t.customerId] })],
);

/** The daily scan: customers with points lapsing within EXPIRING_WITHIN_DAYS of the scan. */
export const pointsExpiringSoon = loyalty.table(
  "points_expiring_soon",
  {
    tenantId: text("tenant_id").notNull(),
    scannedAt: at("scanned_at").notNull(),
    customerId: text("customer_id").notNull(),
    points: bigint("points", { mode: "number" }).notNull(),
    firstExpiresAt: at("first_expires_at").notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.scannedAt, t.customerId] })],
);

/**
 * What the retention purge exports before it deletes: per customer, the sum
 * and count of the credits taken out of the ledger, so a balance still
 * reconciles (balance = rollup + the ledger's remaining credits).
 */
export const ledgerRollups = loyalty.table(
  "ledger_rollups",
  {
    tenantId: text("tenant_id").notNull(),
    customerId: text("customer_id").notNull(),
    points: bigint("points", { mode: "number" }).notNull(),
    credits: integer("credits").notNull(),
    /** The newest credit rolled up so far. */
    through: at("through").notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.customerId] })],
);
