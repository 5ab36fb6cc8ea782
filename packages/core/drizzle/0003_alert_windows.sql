CREATE TABLE "core"."alert_windows" (
	"key" text PRIMARY KEY NOT NULL,
	"queue" text NOT NULL,
	"consumer" text NOT NULL,
	"error_class" text NOT NULL,
	"error_fingerprint" text NOT NULL,
	"window_number" integer DEFAULT 1 NOT NULL,
	"window_started_at" timestamp with time zone NOT NULL,
	"first_dead_letter_id" text NOT NULL,
	"unreported" integer DEFAULT 0 NOT NULL,
	"previous_unreported" integer DEFAULT 0 NOT NULL,
	"previous_window_started_at" timestamp with time zone,
	"last_seen_at" timestamp with time zone NOT NULL,
	CONSTRAINT "alert_windows_unreported_nonnegative" CHECK ("core"."alert_windows"."unreported" >= 0 and "core"."alert_windows"."previous_unreported" >= 0)
);
