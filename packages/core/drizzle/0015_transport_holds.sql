-- Deliveries a transport kept without spending an attempt (#19): Vercel
-- Queues counts every lease, so an original kept on its lease while its
-- successor is not known stored (a 202, a failed send) would come back
-- looking like a spent attempt. The adapter records each hold here and
-- subtracts them; a new table, so nothing live waits on this file.
CREATE TABLE "core"."transport_holds" (
	"consumer" text NOT NULL,
	"message_key" text NOT NULL,
	"delivery_count" integer NOT NULL,
	"held_at" timestamp with time zone DEFAULT now() NOT NULL,
	"successor_seen_at" timestamp with time zone,
	CONSTRAINT "transport_holds_consumer_message_key_delivery_count_pk" PRIMARY KEY("consumer","message_key","delivery_count")
);
--> statement-breakpoint
CREATE INDEX "transport_holds_held_at_idx" ON "core"."transport_holds" USING btree ("held_at");