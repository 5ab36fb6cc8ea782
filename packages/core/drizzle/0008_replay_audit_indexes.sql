-- softcrum-migrate: no-transaction
-- The replay-DLQ view starts from replayed letters (all, or one batch's), and
-- a letter's audit history looks its id up in the audit's scope (#9 item 13).
-- Built CONCURRENTLY, outside a transaction (ADR 0008): dead letters and audit
-- entries keep being written while they build; IF NOT EXISTS makes a rerun a
-- no-op, and the runner first drops an index an interrupted build left INVALID.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_replayed_idx" ON "core"."dead_letters" USING btree ("id") WHERE "status" = 'replayed';--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_replayed_batch_idx" ON "core"."dead_letters" USING btree ("replay_batch_id","id") WHERE "status" = 'replayed';--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "ops_audit_scope_ids_idx" ON "core"."ops_audit" USING gin (("scope" -> 'ids'));--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "ops_audit_scope_batch_idx" ON "core"."ops_audit" USING btree (("scope" ->> 'batchId'));
