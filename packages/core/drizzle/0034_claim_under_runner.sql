-- A running batch's letter is claimed only under the runner that leases the
-- batch (src/ops/ops-hardening.test.ts). A NULL runner passed the check, so
-- an operator's own login calling this function by hand could claim the
-- letters of a batch someone else's runner was running — approved, so past
-- the two-person ceiling — without that runner's pacing, sample gate or stop
-- conditions. The library always names its runner for a batch's claim.
CREATE OR REPLACE FUNCTION core.ops_claim_letter(p_id uuid, p_actor text, p_reason text, p_batch uuid, p_runner text)
RETURNS TABLE (queue text, consumer text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_actor text := core.ops_actor(p_actor);
BEGIN
  IF p_batch IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM core.replay_batches b
    JOIN core.replay_batch_items i ON i.batch_id = b.id AND i.dead_letter_id = p_id
    WHERE b.id = p_batch AND b.status = 'running' AND b.lease_owner = p_runner
  ) THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = format('letter %s is not a letter of batch %s running under this runner (%s)', p_id, p_batch,
                       coalesce(p_runner, 'none named'));
  END IF;
  RETURN QUERY
    UPDATE core.dead_letters d
    SET status = 'replayed', status_changed_at = now(), status_changed_by = v_actor,
        status_reason = p_reason, replay_batch_id = p_batch
    WHERE d.id = p_id AND d.status = 'pending_review'
    RETURNING d.queue, d.consumer;
END $$;
