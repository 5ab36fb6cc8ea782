import { bigserial, index, integer, pgSchema, primaryKey, text, timestamp, uuid } from "drizzle-orm/pg-core";

/** The example module owns the `loyalty` schema; @softcrum/core owns `core`. */
export const loyalty = pgSchema("loyalty");

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
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [index("ledger_customer_idx").on(t.tenantId, t.customerId)],
);

/** Running balance per customer, updated in the same transaction as the ledger row. */
export const balances = loyalty.table(
  "balances",
  {
    tenantId: text("tenant_id").notNull(),
    customerId: text("customer_id").notNull(),
    points: integer("points").notNull(),
    updatedAt: timestamp("updated_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.customerId] })],
);
