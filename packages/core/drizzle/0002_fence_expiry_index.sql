DROP INDEX "core"."processed_jobs_processed_at_idx";--> statement-breakpoint
CREATE INDEX "processed_jobs_expiry_idx" ON "core"."processed_jobs" USING btree ("processed_at","job_id","consumer");