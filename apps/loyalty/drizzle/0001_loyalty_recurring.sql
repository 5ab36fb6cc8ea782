CREATE TABLE "loyalty"."consumption_snapshots" (
	"tenant_id" text NOT NULL,
	"taken_at" timestamp with time zone NOT NULL,
	"credits" integer NOT NULL,
	"points" bigint NOT NULL,
	"customers" integer NOT NULL,
	CONSTRAINT "consumption_snapshots_tenant_id_taken_at_pk" PRIMARY KEY("tenant_id","taken_at")
) PARTITION BY RANGE ("taken_at");
--> statement-breakpoint
-- Edited by hand after drizzle-kit generate (it has no syntax for partitioning): the
-- snapshots are partitioned by month, and this month's and next month's partitions are
-- created here so the table takes rows from the start; the daily loyalty.partitions job
-- creates each month's after that (src/recurring-jobs.ts, same names).
DO $$
DECLARE
	m timestamp; -- a month's first instant, in UTC: month arithmetic on timestamptz follows the session's time zone
BEGIN
	FOR i IN 0..1 LOOP
		m := date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i);
		EXECUTE format(
			'CREATE TABLE IF NOT EXISTS loyalty.%I PARTITION OF loyalty.consumption_snapshots FOR VALUES FROM (%L) TO (%L)',
			'consumption_snapshots_' || to_char(m, '"y"YYYY"m"MM'),
			to_char(m, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
			to_char(m + interval '1 month', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		);
	END LOOP;
END
$$;
--> statement-breakpoint
CREATE TABLE "loyalty"."ledger_rollups" (
	"tenant_id" text NOT NULL,
	"customer_id" text NOT NULL,
	"points" bigint NOT NULL,
	"credits" integer NOT NULL,
	"through" timestamp with time zone NOT NULL,
	CONSTRAINT "ledger_rollups_tenant_id_customer_id_pk" PRIMARY KEY("tenant_id","customer_id")
);
--> statement-breakpoint
CREATE TABLE "loyalty"."points_expiring_soon" (
	"tenant_id" text NOT NULL,
	"scanned_at" timestamp with time zone NOT NULL,
	"customer_id" text NOT NULL,
	"points" bigint NOT NULL,
	"first_expires_at" timestamp with time zone NOT NULL,
	CONSTRAINT "points_expiring_soon_tenant_id_scanned_at_customer_id_pk" PRIMARY KEY("tenant_id","scanned_at","customer_id")
);
--> statement-breakpoint
CREATE TABLE "loyalty"."reconciliation_discrepancies" (
	"tenant_id" text NOT NULL,
	"checked_at" timestamp with time zone NOT NULL,
	"customer_id" text NOT NULL,
	"balance" bigint,
	"expected" bigint,
	CONSTRAINT "reconciliation_discrepancies_tenant_id_checked_at_customer_id_pk" PRIMARY KEY("tenant_id","checked_at","customer_id")
);
--> statement-breakpoint
CREATE TABLE "loyalty"."reconciliations" (
	"tenant_id" text NOT NULL,
	"checked_at" timestamp with time zone NOT NULL,
	"customers" integer NOT NULL,
	"discrepancies" integer NOT NULL,
	CONSTRAINT "reconciliations_tenant_id_checked_at_pk" PRIMARY KEY("tenant_id","checked_at")
);
--> statement-breakpoint
CREATE TABLE "loyalty"."tenant_stats" (
	"tenant_id" text PRIMARY KEY NOT NULL,
	"customers" integer NOT NULL,
	"points" bigint NOT NULL,
	"last_credit_at" timestamp with time zone,
	"computed_for" timestamp with time zone NOT NULL,
	"computed_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "loyalty"."tenants" (
	"tenant_id" text COLLATE "C" PRIMARY KEY NOT NULL,
	"tier" text DEFAULT 'nightly' NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "tenants_tier_check" CHECK ("loyalty"."tenants"."tier" in ('nightly', '12h', '6h', '3h', '1h'))
);
--> statement-breakpoint
ALTER TABLE "loyalty"."ledger" ADD COLUMN "expires_at" timestamp with time zone;