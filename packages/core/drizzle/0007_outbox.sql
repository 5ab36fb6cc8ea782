CREATE TABLE "core"."outbox" (
	"id" uuid PRIMARY KEY NOT NULL,
	"queue" text NOT NULL,
	"payload" text NOT NULL,
	"job_id" uuid NOT NULL,
	"kind" text NOT NULL,
	"target_consumer" text,
	"deliver_after" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"available_at" timestamp with time zone DEFAULT now() NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"published_at" timestamp with time zone,
	"message_id" text,
	CONSTRAINT "outbox_attempts_nonnegative" CHECK ("core"."outbox"."attempts" >= 0),
	CONSTRAINT "outbox_last_error_bounded" CHECK ("core"."outbox"."last_error" is null or char_length("core"."outbox"."last_error") <= 4000)
);
--> statement-breakpoint
CREATE INDEX "outbox_unpublished_idx" ON "core"."outbox" USING btree ("available_at","id") WHERE "core"."outbox"."published_at" is null;--> statement-breakpoint
CREATE INDEX "outbox_published_idx" ON "core"."outbox" USING btree ("published_at") WHERE "core"."outbox"."published_at" is not null;