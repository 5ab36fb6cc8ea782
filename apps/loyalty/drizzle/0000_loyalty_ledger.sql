CREATE SCHEMA "loyalty";
--> statement-breakpoint
CREATE TABLE "loyalty"."balances" (
	"tenant_id" text NOT NULL,
	"customer_id" text NOT NULL,
	"points" integer NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "balances_tenant_id_customer_id_pk" PRIMARY KEY("tenant_id","customer_id")
);
--> statement-breakpoint
CREATE TABLE "loyalty"."ledger" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"job_id" uuid NOT NULL,
	"tenant_id" text NOT NULL,
	"customer_id" text NOT NULL,
	"points" integer NOT NULL,
	"reason" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE INDEX "ledger_customer_idx" ON "loyalty"."ledger" USING btree ("tenant_id","customer_id");