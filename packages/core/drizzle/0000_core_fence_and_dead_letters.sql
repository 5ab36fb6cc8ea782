CREATE SCHEMA "core";
--> statement-breakpoint
CREATE TABLE "core"."dead_letters" (
	"id" uuid PRIMARY KEY NOT NULL,
	"job_id" text,
	"queue" text NOT NULL,
	"consumer" text NOT NULL,
	"payload" text NOT NULL,
	"payload_encoding" text DEFAULT 'utf8' NOT NULL,
	"attempts" integer NOT NULL,
	"last_error" text NOT NULL,
	"error_class" text NOT NULL,
	"status" text DEFAULT 'pending_review' NOT NULL,
	"tenant_id" text,
	"correlation_id" text,
	"kind" text,
	"occurrences" integer DEFAULT 1 NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"last_seen_at" timestamp with time zone DEFAULT now() NOT NULL,
	"status_changed_at" timestamp with time zone,
	"status_changed_by" text,
	"status_reason" text,
	CONSTRAINT "dead_letters_status_valid" CHECK ("core"."dead_letters"."status" in ('pending_review', 'replayed', 'discarded')),
	CONSTRAINT "dead_letters_error_class_valid" CHECK ("core"."dead_letters"."error_class" in ('poison', 'exhausted', 'permanent', 'expired')),
	CONSTRAINT "dead_letters_payload_encoding_valid" CHECK ("core"."dead_letters"."payload_encoding" in ('utf8', 'base64')),
	CONSTRAINT "dead_letters_attempts_nonnegative" CHECK ("core"."dead_letters"."attempts" >= 0),
	CONSTRAINT "dead_letters_last_error_bounded" CHECK (char_length("core"."dead_letters"."last_error") <= 4000),
	CONSTRAINT "dead_letters_discard_needs_reason" CHECK ("core"."dead_letters"."status" <> 'discarded' or ("core"."dead_letters"."status_reason" is not null and btrim("core"."dead_letters"."status_reason") <> '')),
	CONSTRAINT "dead_letters_status_change_recorded" CHECK ("core"."dead_letters"."status" = 'pending_review' or ("core"."dead_letters"."status_changed_at" is not null and "core"."dead_letters"."status_changed_by" is not null and btrim("core"."dead_letters"."status_changed_by") <> ''))
);
--> statement-breakpoint
CREATE TABLE "core"."processed_jobs" (
	"job_id" uuid NOT NULL,
	"consumer" text NOT NULL,
	"processed_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "processed_jobs_job_id_consumer_pk" PRIMARY KEY("job_id","consumer")
);
--> statement-breakpoint
CREATE UNIQUE INDEX "dead_letters_one_pending_per_job_consumer" ON "core"."dead_letters" USING btree ("job_id","consumer") WHERE "core"."dead_letters"."status" = 'pending_review';--> statement-breakpoint
CREATE INDEX "dead_letters_status_created_idx" ON "core"."dead_letters" USING btree ("status","created_at");--> statement-breakpoint
CREATE INDEX "dead_letters_queue_consumer_idx" ON "core"."dead_letters" USING btree ("queue","consumer","status");--> statement-breakpoint
CREATE INDEX "processed_jobs_processed_at_idx" ON "core"."processed_jobs" USING btree ("processed_at");