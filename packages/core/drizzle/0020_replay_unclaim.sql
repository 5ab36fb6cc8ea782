-- An in-process replay is applied, or its letter goes back (#21 item 4). The
-- consumer runs in the operator's process only after the claim commits (its
-- fence check waits on the letter's key while the claim is open); when it
-- wrote neither its fence nor a dead letter, the letter returns to
-- `pending_review` — unless the job's fence exists by then (a delivery that
-- was still running committed: it was applied after all). Serialised on the
-- fence key like a dead-letter decision: a delivery still committing is
-- waited for, one that has not reached its fence yet finds the letter
-- pending and does not run. Only the actor who claimed it puts it back.
CREATE OR REPLACE FUNCTION core.ops_unclaim_letter(p_id uuid, p_actor text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
  v_job text;
  v_consumer text;
  n integer;
BEGIN
  SELECT job_id, consumer INTO v_job, v_consumer FROM core.dead_letters
  WHERE id = p_id AND status = 'replayed' AND status_changed_by = v_actor
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  INSERT INTO core.processed_jobs (job_id, consumer) VALUES (v_job::uuid, v_consumer) ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n = 0 THEN
    RETURN false;
  END IF;
  UPDATE core.dead_letters
  SET status = 'pending_review', status_changed_at = NULL, status_changed_by = NULL, status_reason = NULL,
      replay_batch_id = NULL
  WHERE id = p_id;
  DELETE FROM core.processed_jobs WHERE job_id = v_job::uuid AND consumer = v_consumer;
  RETURN true;
END $$;
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_unclaim_letter(uuid, text) FROM PUBLIC;
--> statement-breakpoint
GRANT EXECUTE ON FUNCTION core.ops_unclaim_letter(uuid, text) TO softcrum_ops_operator;
