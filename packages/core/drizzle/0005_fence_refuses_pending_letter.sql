-- Superseded before release: this migration created a deferred constraint
-- trigger on core.processed_jobs that refused the COMMIT of a job whose dead
-- letter was pending. The work transaction now checks for a pending letter
-- right after its fence, before the handler runs (packages/core/src/db/
-- work-transaction.ts, LETTER_SQL), which also keeps the handler from running
-- for such a job, at a fraction of the trigger's cost per job. The migration
-- stays in the journal, doing nothing, so the numbering does not move.
SELECT 1;
