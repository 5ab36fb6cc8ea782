-- softcrum-migrate: no-transaction
-- #10: replay batches keep their counts incrementally (items remember what
-- became of their replayed job), and the two-person rule counts what one
-- operator replayed over a rolling window (direct replays, batches requested).
-- Outside a transaction (ADR 0008) so the index on dead letters is built
-- CONCURRENTLY; every statement is a no-op when rerun.
ALTER TABLE "core"."replay_batch_items" ADD COLUMN IF NOT EXISTS "resolution" text;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "succeeded" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "window_succeeded" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "window_failed_again" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" DROP CONSTRAINT IF EXISTS "replay_batch_items_resolution_valid";--> statement-breakpoint
ALTER TABLE "core"."replay_batch_items" ADD CONSTRAINT "replay_batch_items_resolution_valid" CHECK ("core"."replay_batch_items"."resolution" is null or "core"."replay_batch_items"."resolution" in ('succeeded', 'failed_again'));--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_direct_replays_idx" ON "core"."dead_letters" USING btree ("status_changed_by","status_changed_at") WHERE "status" = 'replayed' and "replay_batch_id" is null;--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "replay_batch_items_unresolved_idx" ON "core"."replay_batch_items" USING btree ("batch_id","replayed_at") WHERE "state" = 'replayed' and "resolution" is null;--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "replay_batches_requester_idx" ON "core"."replay_batches" USING btree ("requested_by","created_at");
