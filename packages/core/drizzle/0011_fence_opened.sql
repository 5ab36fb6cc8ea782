-- What a new fence row needs before its job's handler may run, computed in the
-- fence insert's own RETURNING (packages/core/src/db/work-transaction.ts,
-- FENCE_SQL), so the harness sends one statement per job fewer (#8: the
-- benchmark's ratio_raw):
-- - the server-side bounds of the rest of the work transaction
--   (statement_timeout, idle_in_transaction_session_timeout, transaction-local);
-- - the job's pending dead letter, if any ("<id> <error_class>", else NULL).
--   The function is VOLATILE, so in READ COMMITTED its query takes a fresh
--   snapshot when it runs: after the insert finished waiting on a concurrent
--   holder of the fence key (a dead-letter decision, decideDeadLetter), it sees
--   the letter that holder committed, which the insert's own snapshot would
--   not. FOR SHARE waits for a replay changing the letter's status right now
--   and reads the status it committed.
CREATE OR REPLACE FUNCTION "core"."fence_opened"(p_job_id uuid, p_consumer text, p_timeout text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
  detail text;
BEGIN
  PERFORM set_config('statement_timeout', p_timeout, true),
          set_config('idle_in_transaction_session_timeout', p_timeout, true);
  SELECT id::text || ' ' || error_class INTO detail
    FROM core.dead_letters
   WHERE job_id = p_job_id::text AND consumer = p_consumer AND status = 'pending_review'
   LIMIT 1
     FOR SHARE;
  RETURN detail;
END
$$;
