-- Operators' controls the database itself holds, where a second reader
-- found them open (src/ops/ops-hardening.test.ts).
--
-- 1. A batch's recorded times (started, ended, the rate window, the sample's
-- pass) come from the caller only for a login the database trusts
-- (core.ops_time), as every other ops function records them: an operator's
-- own login could backdate them. A runner renews its lease only while the
-- batch is unexpired by the database's clock too.
CREATE OR REPLACE FUNCTION core.ops_batch_set(p_id uuid, p_action text, p_actor text, p_reason text,
                                   p_runner text, p_at timestamptz, p_lease_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
  -- The caller's time only from a trusted login (ops_time), as every other ops function records it.
  v_at timestamptz := core.ops_time(p_at);
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
      WHERE id = p_id AND lease_owner = p_runner AND status = 'running' AND expires_at > v_at AND expires_at > now();
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
-- 2. The two-person ceiling (migration 0025) counts a batch's claims for the
-- batch's requester, whoever claims them: a second login leasing the
-- requester's unapproved batches passed 100 by being checked against its own.
CREATE OR REPLACE FUNCTION core.ops_approval_ceiling() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ceiling constant integer := 100;
  unapproved boolean;
  v_requester text;
BEGIN
  IF core.ops_trusted() THEN
    RETURN NEW;
  END IF;
  IF TG_TABLE_NAME = 'replay_batches' THEN
    IF NEW.status = 'ready' AND NEW.approved_by IS NULL
       AND NEW.selected + core.ops_unapproved_replays(NEW.requested_by) > ceiling THEN
      NEW.status := 'awaiting_approval';
    END IF;
    RETURN NEW;
  END IF;
  -- A claim (or a claim again) of a letter: counted under the requester's
  -- quota lock (lockReplayQuota). A batch's letter counts for the batch's
  -- requester, whoever claims it: ops_unapproved_replays counts it there, so
  -- a second login running a requester's unapproved batches must not be
  -- checked against its own count instead.
  IF NEW.replay_batch_id IS NULL THEN
    unapproved := true;
    v_requester := NEW.status_changed_by;
  ELSE
    SELECT approved_by IS NULL, requested_by INTO unapproved, v_requester
    FROM core.replay_batches WHERE id = NEW.replay_batch_id;
  END IF;
  IF unapproved THEN
    PERFORM pg_advisory_xact_lock(hashtext('softcrum.ops.replay-quota'), hashtext(v_requester));
    IF core.ops_unapproved_replays(v_requester) >= ceiling THEN
      RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('%s replayed %s letters without a second person''s approval in 24 hours: another operator must approve a batch for more',
                         v_requester, ceiling);
    END IF;
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
-- 3. The HTTP API's login counted unauthenticated calls by writing
-- core.ops_audit itself, and could so rewrite any audit row. It counts them
-- through this function now, which touches only the counting rows, and
-- loses its own INSERT and UPDATE on the table.
CREATE OR REPLACE FUNCTION core.ops_count_unauthenticated(p_id uuid, p_minute timestamptz, p_action text,
                                                          p_scope jsonb, p_path text, p_detail text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO core.ops_audit AS a (id, at, operator, action, scope, result, detail)
  VALUES (p_id, p_minute, '(unauthenticated)', 'http.unauthenticated', coalesce(p_scope, '{}'::jsonb), 'refused',
          left(p_detail, 500))
  ON CONFLICT (id) DO UPDATE SET
    scope = jsonb_set(
              jsonb_set(a.scope, '{count}', to_jsonb(coalesce((a.scope ->> 'count')::int, 0) + 1)),
              ARRAY['actions', p_action],
              to_jsonb(coalesce((a.scope -> 'actions' ->> p_action)::int, 0) + 1))
            || jsonb_build_object('lastPath', left(p_path, 200)),
    detail = excluded.detail
  WHERE a.action = 'http.unauthenticated' AND a.operator = '(unauthenticated)';
END $$;
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_count_unauthenticated(uuid, timestamptz, text, jsonb, text, text) FROM PUBLIC;
--> statement-breakpoint
GRANT EXECUTE ON FUNCTION core.ops_count_unauthenticated(uuid, timestamptz, text, jsonb, text, text) TO softcrum_ops_service;
--> statement-breakpoint
REVOKE INSERT, UPDATE ON core.ops_audit FROM softcrum_ops_service;
