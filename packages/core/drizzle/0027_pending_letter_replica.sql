-- core.pending_letter_keys is kept by ordinary triggers of core.dead_letters
-- (migration 0014), and a session whose session_replication_role is
-- 'replica' fires no ordinary trigger: a letter it writes leaves no key, and
-- a fence inserted there would not see a pending letter whose key was never
-- written. So the harness's reads of the keys (the fence's check) and its
-- dead-letter decisions refuse to run in such a session, with an error that
-- says why: the delivery is deferred, no attempt spent, never run beside a
-- pending letter. (The triggers stay ordinary: a logical-replication
-- subscriber applies the keys it is sent, in replica mode, and must not
-- write them twice.)
CREATE OR REPLACE FUNCTION "core"."pending_letter_keys_kept"()
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
  IF current_setting('session_replication_role') = 'replica' THEN
    RAISE EXCEPTION 'session_replication_role is replica in this session: core.dead_letters'' triggers, which keep core.pending_letter_keys, do not fire, so a pending dead letter could be missed; the harness runs no work transaction and writes no dead letter here (set session_replication_role to origin for its role or database)'
      USING ERRCODE = '55000';
  END IF;
  RETURN true;
END
$$;
--> statement-breakpoint
-- Migration 0014's function, with that check first.
CREATE OR REPLACE FUNCTION "core"."pending_letter"(p_job_id uuid, p_consumer text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
  detail text;
BEGIN
  PERFORM core.pending_letter_keys_kept();
  SELECT dead_letter_id::text || ' ' || error_class INTO detail
    FROM core.pending_letter_keys
   WHERE job_id = p_job_id::text AND consumer = p_consumer
     FOR SHARE;
  RETURN detail;
END
$$;
