-- softcrum-migrate: no-transaction
-- Replays that hit an existing fence (#21 item 5): an item may resolve as a
-- duplicate, the batch counts them (overall and since its rate window), may
-- pause on their rate, and remembers when it last resolved a job (its time
-- to recovery). Outside a transaction (ADR 0008): each ALTER holds its lock
-- only for a catalog change; the new CHECKs are added NOT VALID and validated
-- under locks that let writers on.
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); the widened CHECK below replaces it
ALTER TABLE "core"."replay_batch_items" DROP CONSTRAINT IF EXISTS "replay_batch_items_resolution_valid";--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "duplicates" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "window_duplicates" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "max_duplicate_rate" double precision DEFAULT 0.5 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "last_resolved_at" timestamp with time zone;--> statement-breakpoint
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); drops a half-made constraint so an interrupted run can be rerun
ALTER TABLE "core"."replay_batch_items" DROP CONSTRAINT IF EXISTS "replay_batch_items_resolution_valid";--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" ADD CONSTRAINT "replay_batch_items_resolution_valid" CHECK ("core"."replay_batch_items"."resolution" is null or "core"."replay_batch_items"."resolution" in ('succeeded', 'failed_again', 'duplicate')) NOT VALID;--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" VALIDATE CONSTRAINT "replay_batch_items_resolution_valid";--> statement-breakpoint
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); drops a half-made constraint so an interrupted run can be rerun
ALTER TABLE "core"."replay_batches" DROP CONSTRAINT IF EXISTS "replay_batches_duplicate_rate_range";--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD CONSTRAINT "replay_batches_duplicate_rate_range" CHECK ("core"."replay_batches"."max_duplicate_rate" > 0 and "core"."replay_batches"."max_duplicate_rate" <= 1) NOT VALID;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" VALIDATE CONSTRAINT "replay_batches_duplicate_rate_range";
