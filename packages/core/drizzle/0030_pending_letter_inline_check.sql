-- The fence's pending-letter check, cheaper by a function call: migration
-- 0027's replica check, inline. 0027 made core.pending_letter() call
-- core.pending_letter_keys_kept() with PERFORM, which is a query of its own
-- (an SPI query running a second PL/pgSQL function) on every fence insert:
-- measured with pgbench on a fence insert returning the check, that call
-- was most of the check's cost (0.344 ms a transaction with no check, 0.377
-- with 0027's check, 0.343-0.351 with this one). The IF below is a plain
-- expression, which PL/pgSQL evaluates without a query. Same error, same
-- SQLSTATE (55000), same answer; the SELECT is still a query of its own, so
-- under READ COMMITTED it still takes a fresh snapshot after the insert is
-- done waiting on the fence key (the function stays VOLATILE).
-- core.pending_letter_keys_kept() stays for the batch's check, the
-- dead-letter decision and the letter write, which call it once a statement.
CREATE OR REPLACE FUNCTION "core"."pending_letter"(p_job_id uuid, p_consumer text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
  detail text;
BEGIN
  IF current_setting('session_replication_role') = 'replica' THEN
    RAISE EXCEPTION 'session_replication_role is replica in this session: core.dead_letters'' triggers, which keep core.pending_letter_keys, do not fire, so a pending dead letter could be missed; the harness runs no work transaction and writes no dead letter here (set session_replication_role to origin for its role or database)'
      USING ERRCODE = '55000';
  END IF;
  SELECT dead_letter_id::text || ' ' || error_class INTO detail
    FROM core.pending_letter_keys
   WHERE job_id = p_job_id::text AND consumer = p_consumer
     FOR SHARE;
  RETURN detail;
END
$$;
