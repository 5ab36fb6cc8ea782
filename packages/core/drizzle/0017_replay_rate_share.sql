-- softcrum-migrate: no-transaction
-- A batch paced as a share of its consumers' live throughput (#21 item 5):
-- the share and the floor of the paced rate (its ceiling is rate_per_second).
-- Outside a transaction (ADR 0008): each ALTER holds its lock only for a
-- catalog change; the CHECK is added NOT VALID and validated under a lock that
-- lets writers on.
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "rate_share" double precision;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN IF NOT EXISTS "rate_floor" double precision;--> statement-breakpoint
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); drops a half-made constraint so an interrupted run can be rerun
ALTER TABLE "core"."replay_batches" DROP CONSTRAINT IF EXISTS "replay_batches_rate_share_range";--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD CONSTRAINT "replay_batches_rate_share_range" CHECK (("core"."replay_batches"."rate_share" is null and "core"."replay_batches"."rate_floor" is null) or ("core"."replay_batches"."rate_share" > 0 and "core"."replay_batches"."rate_share" <= 1 and "core"."replay_batches"."rate_floor" > 0 and "core"."replay_batches"."rate_floor" <= "core"."replay_batches"."rate_per_second")) NOT VALID;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" VALIDATE CONSTRAINT "replay_batches_rate_share_range";
