CREATE SCHEMA "notifications";
--> statement-breakpoint
CREATE TABLE "notifications"."blast_chunk_sends" (
	"blast_id" uuid NOT NULL,
	"chunk" integer NOT NULL,
	"job_id" uuid NOT NULL,
	"recipients" integer NOT NULL,
	"attempt" integer NOT NULL,
	"sent_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "blast_chunk_sends_blast_id_chunk_pk" PRIMARY KEY("blast_id","chunk")
);
--> statement-breakpoint
CREATE TABLE "notifications"."blast_recipients" (
	"blast_id" uuid NOT NULL,
	"position" integer NOT NULL,
	"contact_id" bigint NOT NULL,
	"email" text NOT NULL,
	"name" text,
	"provider_email_id" text,
	"sent_at" timestamp with time zone,
	CONSTRAINT "blast_recipients_blast_id_position_pk" PRIMARY KEY("blast_id","position")
);
--> statement-breakpoint
CREATE TABLE "notifications"."blasts" (
	"id" uuid PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"from_address" text NOT NULL,
	"subject" text NOT NULL,
	"html" text,
	"text" text,
	"reply_to" text,
	"chunk_size" integer NOT NULL,
	"recipients" integer NOT NULL,
	"chunks" integer NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "notifications"."contacts" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"email" text NOT NULL,
	"name" text,
	"unsubscribed_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "notifications"."email_sends" (
	"job_id" uuid PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"lane" text NOT NULL,
	"to_address" text NOT NULL,
	"subject" text NOT NULL,
	"provider_email_id" text NOT NULL,
	"sent_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "notifications"."blast_chunk_sends" ADD CONSTRAINT "blast_chunk_sends_blast_id_blasts_id_fk" FOREIGN KEY ("blast_id") REFERENCES "notifications"."blasts"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "notifications"."blast_recipients" ADD CONSTRAINT "blast_recipients_blast_id_blasts_id_fk" FOREIGN KEY ("blast_id") REFERENCES "notifications"."blasts"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "contacts_tenant_email_idx" ON "notifications"."contacts" USING btree ("tenant_id","email");--> statement-breakpoint
CREATE INDEX "contacts_tenant_id_idx" ON "notifications"."contacts" USING btree ("tenant_id","id");--> statement-breakpoint
CREATE INDEX "email_sends_tenant_idx" ON "notifications"."email_sends" USING btree ("tenant_id","sent_at");