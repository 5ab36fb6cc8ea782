-- softcrum-migrate: no-transaction
-- The recurring jobs read a tenant's credits by time (a snapshot's window, the
-- retention cutoff, expiry). Built CONCURRENTLY, outside a transaction (ADR 0008):
-- credits keep being written to the ledger while they build; IF NOT EXISTS makes a
-- rerun after an interruption a no-op.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "ledger_created_idx" ON "loyalty"."ledger" USING btree ("tenant_id","created_at");--> statement-breakpoint
CREATE INDEX CONCURRENTLY IF NOT EXISTS "ledger_expires_idx" ON "loyalty"."ledger" USING btree ("tenant_id","expires_at");