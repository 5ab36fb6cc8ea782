-- softcrum-migrate: no-transaction
-- Partial indexes on pending dead letters for the operator queries and the
-- depth gauge (#9 items 10, 11). Built CONCURRENTLY, outside a transaction
-- (ADR 0008): dead letters keep being written while they build. IF NOT EXISTS
-- makes a rerun after an interruption a no-op; the runner first drops an index
-- an interrupted build left INVALID.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_pending_tenant_idx" ON "core"."dead_letters" USING btree ("tenant_id","id") WHERE "status" = 'pending_review';--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_pending_queue_consumer_idx" ON "core"."dead_letters" USING btree ("queue","consumer","id") INCLUDE ("created_at") WHERE "status" = 'pending_review';--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_pending_kind_class_idx" ON "core"."dead_letters" USING btree ("kind","error_class","id") WHERE "status" = 'pending_review';
