-- A batch's lease runs on the database's clock, not the runner's (#21 item
-- 10): two runners on machines whose clocks differ agree when a lease has
-- lapsed. ops_batch_set takes the lease's length instead of its end.
DROP FUNCTION core.ops_batch_set(uuid, text, text, text, text, timestamptz, timestamptz);
--> statement-breakpoint
CREATE FUNCTION core.ops_batch_set(p_id uuid, p_action text, p_actor text, p_reason text,
                                   p_runner text, p_at timestamptz, p_lease_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
  v_at timestamptz := coalesce(p_at, now());
  -- Leases run on the database's clock: runners on other machines agree on it.
  v_lease_until timestamptz := now() + make_interval(secs => coalesce(p_lease_ms, 0) / 1000.0);
  n integer;
BEGIN
  IF p_action IN ('pause', 'stop', 'resume', 'lease') THEN
    -- The batch's control lock (lockBatch): waits for the claims in flight.
    PERFORM pg_advisory_xact_lock(hashtext('softcrum.ops.batch'), hashtext(p_id::text));
  END IF;
  CASE p_action
    WHEN 'pause' THEN
      UPDATE core.replay_batches SET status = 'paused', stop_reason = format('paused by %s: %s', v_actor, p_reason)
      WHERE id = p_id AND status IN ('ready', 'running');
    WHEN 'stop' THEN
      UPDATE core.replay_batches
      SET status = 'stopped', stop_reason = format('stopped by %s: %s', v_actor, p_reason), ended_at = v_at
      WHERE id = p_id AND status IN ('awaiting_approval', 'ready', 'running', 'paused');
    WHEN 'resume' THEN
      -- Only a sample that ran and failed is accepted by resuming; the failure rate counts afresh.
      UPDATE core.replay_batches
      SET status = 'ready', stop_reason = NULL, rate_window_start = v_at,
          window_succeeded = 0, window_failed_again = 0, window_duplicates = 0,
          sample_passed_at = CASE WHEN sample_size IS NOT NULL AND sample_passed_at IS NULL
                                       AND stop_reason LIKE 'sample:%' THEN v_at ELSE sample_passed_at END
      WHERE id = p_id AND status = 'paused';
    WHEN 'lease' THEN
      UPDATE core.replay_batches
      SET status = 'running', lease_owner = p_runner, lease_expires_at = v_lease_until,
          started_at = coalesce(started_at, v_at), rate_window_start = coalesce(rate_window_start, v_at)
      WHERE id = p_id AND status IN ('ready', 'running') AND (lease_owner IS NULL OR lease_expires_at < now());
    WHEN 'renew' THEN
      UPDATE core.replay_batches SET lease_expires_at = v_lease_until
      WHERE id = p_id AND lease_owner = p_runner AND status = 'running';
    WHEN 'renew_unexpired' THEN
      UPDATE core.replay_batches SET lease_expires_at = v_lease_until
      WHERE id = p_id AND lease_owner = p_runner AND status = 'running' AND expires_at > v_at;
    WHEN 'pause_running', 'await_approval' THEN
      UPDATE core.replay_batches
      SET status = CASE WHEN p_action = 'await_approval' THEN 'awaiting_approval' ELSE 'paused' END,
          stop_reason = p_reason
      WHERE id = p_id AND status = 'running' AND lease_owner = p_runner;
    WHEN 'sample_passed' THEN
      UPDATE core.replay_batches SET sample_passed_at = v_at WHERE id = p_id AND lease_owner = p_runner;
    WHEN 'release' THEN
      UPDATE core.replay_batches SET lease_owner = NULL, lease_expires_at = NULL
      WHERE id = p_id AND lease_owner = p_runner;
    WHEN 'complete', 'expire' THEN
      UPDATE core.replay_batches
      SET status = CASE WHEN p_action = 'complete' THEN 'completed' ELSE 'expired' END, stop_reason = p_reason,
          ended_at = v_at, lease_owner = NULL, lease_expires_at = NULL
      WHERE id = p_id AND status IN ('ready', 'running');
    ELSE
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('unknown batch action %s', p_action);
  END CASE;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n > 0;
END $$;
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_batch_set(uuid, text, text, text, text, timestamptz, integer) FROM PUBLIC;
--> statement-breakpoint
GRANT EXECUTE ON FUNCTION core.ops_batch_set(uuid, text, text, text, text, timestamptz, integer) TO softcrum_ops_operator;
