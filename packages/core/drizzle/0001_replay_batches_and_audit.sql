CREATE TABLE "core"."ops_audit" (
	"id" uuid PRIMARY KEY NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"operator" text NOT NULL,
	"action" text NOT NULL,
	"scope" jsonb NOT NULL,
	"result" text NOT NULL,
	"detail" text,
	CONSTRAINT "ops_audit_result_valid" CHECK ("core"."ops_audit"."result" in ('ok', 'rejected', 'refused', 'error'))
);
--> statement-breakpoint
CREATE TABLE "core"."replay_batch_items" (
	"batch_id" uuid NOT NULL,
	"dead_letter_id" uuid NOT NULL,
	"position" integer NOT NULL,
	"state" text DEFAULT 'pending' NOT NULL,
	"in_sample" boolean DEFAULT false NOT NULL,
	"replayed_at" timestamp with time zone,
	CONSTRAINT "replay_batch_items_batch_id_dead_letter_id_pk" PRIMARY KEY("batch_id","dead_letter_id"),
	CONSTRAINT "replay_batch_items_state_valid" CHECK ("core"."replay_batch_items"."state" in ('pending', 'replayed', 'skipped'))
);
--> statement-breakpoint
CREATE TABLE "core"."replay_batches" (
	"id" uuid PRIMARY KEY NOT NULL,
	"status" text NOT NULL,
	"filter" jsonb NOT NULL,
	"requested_by" text NOT NULL,
	"reason" text NOT NULL,
	"approved_by" text,
	"approved_at" timestamp with time zone,
	"rate_per_second" double precision NOT NULL,
	"batch_size" integer NOT NULL,
	"sample_size" integer,
	"max_failure_rate" double precision NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	"selected" integer NOT NULL,
	"replayed" integer DEFAULT 0 NOT NULL,
	"skipped" integer DEFAULT 0 NOT NULL,
	"failed_again" integer DEFAULT 0 NOT NULL,
	"sample_passed_at" timestamp with time zone,
	"rate_window_start" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone,
	"ended_at" timestamp with time zone,
	"stop_reason" text,
	"lease_owner" text,
	"lease_expires_at" timestamp with time zone,
	CONSTRAINT "replay_batches_status_valid" CHECK ("core"."replay_batches"."status" in ('awaiting_approval', 'ready', 'running', 'paused', 'completed', 'stopped', 'expired')),
	CONSTRAINT "replay_batches_reason_given" CHECK (btrim("core"."replay_batches"."reason") <> ''),
	CONSTRAINT "replay_batches_requester_given" CHECK (btrim("core"."replay_batches"."requested_by") <> ''),
	CONSTRAINT "replay_batches_approver_not_requester" CHECK ("core"."replay_batches"."approved_by" is null or "core"."replay_batches"."approved_by" <> "core"."replay_batches"."requested_by"),
	CONSTRAINT "replay_batches_rate_positive" CHECK ("core"."replay_batches"."rate_per_second" > 0),
	CONSTRAINT "replay_batches_batch_size_positive" CHECK ("core"."replay_batches"."batch_size" > 0),
	CONSTRAINT "replay_batches_sample_size_positive" CHECK ("core"."replay_batches"."sample_size" is null or "core"."replay_batches"."sample_size" > 0),
	CONSTRAINT "replay_batches_failure_rate_range" CHECK ("core"."replay_batches"."max_failure_rate" > 0 and "core"."replay_batches"."max_failure_rate" <= 1)
);
--> statement-breakpoint
ALTER TABLE "core"."dead_letters" ADD COLUMN "replay_batch_id" uuid;--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" ADD CONSTRAINT "replay_batch_items_batch_id_replay_batches_id_fk" FOREIGN KEY ("batch_id") REFERENCES "core"."replay_batches"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" ADD CONSTRAINT "replay_batch_items_dead_letter_id_dead_letters_id_fk" FOREIGN KEY ("dead_letter_id") REFERENCES "core"."dead_letters"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "ops_audit_at_idx" ON "core"."ops_audit" USING btree ("at");--> statement-breakpoint
CREATE INDEX "replay_batch_items_order_idx" ON "core"."replay_batch_items" USING btree ("batch_id","state","position");--> statement-breakpoint
CREATE INDEX "replay_batches_status_idx" ON "core"."replay_batches" USING btree ("status","created_at");--> statement-breakpoint
CREATE INDEX "dead_letters_job_consumer_idx" ON "core"."dead_letters" USING btree ("job_id","consumer");