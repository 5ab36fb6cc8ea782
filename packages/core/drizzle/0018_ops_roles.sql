-- Least-privilege roles for the operator tooling and the workers (#21 item 3),
-- and the functions through which operators change state. Operators get no
-- INSERT, UPDATE or DELETE on core.dead_letters, core.replay_batches or
-- core.ops_audit: every change goes through a SECURITY DEFINER function below
-- that takes the actor from the session (`session_user`), so `approved_by`,
-- `status_changed_by` and an audit row's `operator` cannot be typed by hand.
-- Only a trusted session names the actor itself: a member of
-- softcrum_ops_service (the HTTP API, which names the verified token's
-- subject) or of the role that owns the schema (the deploy role, tests).
--
-- Roles are cluster-wide: each is created only when missing, so a DBA may
-- create them beforehand and the deploy role then needs no CREATEROLE.
DO $$
DECLARE
  r text;
  m record;
BEGIN
  FOREACH r IN ARRAY ARRAY['softcrum_ops_reader', 'softcrum_ops_operator', 'softcrum_ops_approver',
                           'softcrum_ops_service', 'softcrum_worker'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN', r);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL; -- created meanwhile by a migration of another database of this cluster
      END;
    END IF;
  END LOOP;
  FOR m IN SELECT * FROM (VALUES ('softcrum_ops_reader', 'softcrum_ops_operator'),
                                 ('softcrum_ops_reader', 'softcrum_ops_approver'),
                                 ('softcrum_ops_operator', 'softcrum_ops_service'),
                                 ('softcrum_ops_approver', 'softcrum_ops_service')) AS v(grp, member) LOOP
    IF NOT pg_catalog.pg_has_role(m.member, m.grp, 'MEMBER') THEN
      BEGIN
        EXECUTE format('GRANT %I TO %I', m.grp, m.member);
      EXCEPTION WHEN OTHERS THEN
        -- Two databases granting at once: fine if the other one did it.
        IF NOT pg_catalog.pg_has_role(m.member, m.grp, 'MEMBER') THEN RAISE; END IF;
      END;
    END IF;
  END LOOP;
END $$;
--> statement-breakpoint
-- Whether this session may name the actor of a change: the HTTP API's role
-- (it names the verified token's subject) or the schema's owner (who can
-- write the tables directly anyway).
CREATE OR REPLACE FUNCTION core.ops_trusted() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT pg_has_role(session_user, 'softcrum_ops_service', 'MEMBER')
      OR pg_has_role(session_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'core'), 'MEMBER')
$$;
--> statement-breakpoint
-- The actor of a change: the name a trusted session gives, else the role the
-- session logged in as. An untrusted session naming someone else is refused.
CREATE OR REPLACE FUNCTION core.ops_actor(p_claimed text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF core.ops_trusted() THEN
    IF p_claimed IS NULL OR btrim(p_claimed) = '' THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'an operator name is required';
    END IF;
    RETURN p_claimed;
  END IF;
  IF p_claimed IS NOT NULL AND lower(p_claimed) <> lower(session_user::text) THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = format('role %s may not act as %s: the database records the role that logged in', session_user, p_claimed);
  END IF;
  RETURN session_user::text;
END $$;
--> statement-breakpoint
-- A time a trusted session may give (its clock); anyone else gets the database's.
CREATE OR REPLACE FUNCTION core.ops_time(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN core.ops_trusted() AND p_at IS NOT NULL THEN p_at ELSE now() END
$$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION core.ops_audit_write(p_id uuid, p_at timestamptz, p_actor text, p_action text,
                                                p_scope jsonb, p_result text, p_detail text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO core.ops_audit (id, at, operator, action, scope, result, detail)
  VALUES (p_id, core.ops_time(p_at), core.ops_actor(p_actor), p_action, coalesce(p_scope, '{}'::jsonb), p_result, p_detail);
END $$;
--> statement-breakpoint
-- Deletes up to p_limit audit entries older than p_cutoff; an untrusted
-- session may not delete anything younger than 30 days (the minimum retention).
CREATE OR REPLACE FUNCTION core.ops_prune_audit(p_cutoff timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n integer;
BEGIN
  IF NOT core.ops_trusted() AND p_cutoff > now() - interval '30 days' THEN
    RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'audit entries younger than 30 days are never deleted';
  END IF;
  WITH victim AS (
    DELETE FROM core.ops_audit WHERE id IN (
      SELECT id FROM core.ops_audit WHERE at < p_cutoff ORDER BY at LIMIT p_limit FOR UPDATE SKIP LOCKED)
    RETURNING 1)
  SELECT count(*)::integer INTO n FROM victim;
  RETURN n;
END $$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION core.ops_discard_letters(p_ids uuid[], p_actor text, p_reason text) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
BEGIN
  RETURN QUERY
    UPDATE core.dead_letters d
    SET status = 'discarded', status_changed_at = now(), status_changed_by = v_actor, status_reason = p_reason
    WHERE d.id = ANY (p_ids) AND d.status = 'pending_review'
    RETURNING d.id;
END $$;
--> statement-breakpoint
-- Marks a pending letter replayed (the caller publishes in the same
-- transaction). A batch's letter only while the batch runs, by its runner.
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
    WHERE b.id = p_batch AND b.status = 'running' AND (p_runner IS NULL OR b.lease_owner = p_runner)
  ) THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = format('letter %s is not a letter of batch %s running under this runner', p_id, p_batch);
  END IF;
  RETURN QUERY
    UPDATE core.dead_letters d
    SET status = 'replayed', status_changed_at = now(), status_changed_by = v_actor,
        status_reason = p_reason, replay_batch_id = p_batch
    WHERE d.id = p_id AND d.status = 'pending_review'
    RETURNING d.queue, d.consumer;
END $$;
--> statement-breakpoint
-- Records a batch: the requester is the actor; its letters in order, the first p_sample in the sample.
CREATE OR REPLACE FUNCTION core.ops_create_batch(p_batch jsonb, p_actor text, p_needs_approval boolean,
                                                 p_letters uuid[], p_sample integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r core.replay_batches;
BEGIN
  r := jsonb_populate_record(NULL::core.replay_batches, p_batch);
  INSERT INTO core.replay_batches (id, status, filter, requested_by, reason, rate_per_second, rate_share, rate_floor,
                                   batch_size, sample_size, max_failure_rate, max_duplicate_rate, expires_at,
                                   selected, created_at)
  VALUES (r.id, CASE WHEN p_needs_approval THEN 'awaiting_approval' ELSE 'ready' END, r.filter,
          core.ops_actor(p_actor), r.reason, r.rate_per_second, r.rate_share, r.rate_floor, r.batch_size,
          r.sample_size, r.max_failure_rate, r.max_duplicate_rate, r.expires_at,
          coalesce(cardinality(p_letters), 0), core.ops_time(r.created_at));
  INSERT INTO core.replay_batch_items (batch_id, dead_letter_id, position, in_sample)
  SELECT r.id, l.id, (l.n - 1)::integer, l.n <= coalesce(p_sample, 0)
  FROM unnest(p_letters) WITH ORDINALITY AS l(id, n);
END $$;
--> statement-breakpoint
-- A second person approves: the approver is the actor, never the requester,
-- and (unless trusted) a member of softcrum_ops_approver. Null when approved,
-- else the batch's status ('missing' when there is none).
CREATE OR REPLACE FUNCTION core.ops_batch_approve(p_id uuid, p_actor text, p_at timestamptz) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
  v_requester text;
  v_status text;
BEGIN
  IF NOT core.ops_trusted() AND NOT pg_has_role(session_user, 'softcrum_ops_approver', 'MEMBER') THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = format('role %s may not approve replay batches: grant it softcrum_ops_approver', session_user);
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('softcrum.ops.batch'), hashtext(p_id::text));
  SELECT requested_by, status INTO v_requester, v_status FROM core.replay_batches WHERE id = p_id;
  IF NOT FOUND THEN
    RETURN 'missing';
  END IF;
  IF lower(v_requester) = lower(v_actor) THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = format('%s requested batch %s and cannot approve it; another operator must', v_actor, p_id);
  END IF;
  IF v_status <> 'awaiting_approval' THEN
    RETURN v_status;
  END IF;
  UPDATE core.replay_batches SET status = 'ready', approved_by = v_actor, approved_at = core.ops_time(p_at)
  WHERE id = p_id;
  RETURN NULL;
END $$;
--> statement-breakpoint
-- Every other change of a batch's state, lease or progress, by name. An
-- operator's pause and stop say who (the actor) in the stop reason. True
-- when the row changed.
CREATE OR REPLACE FUNCTION core.ops_batch_set(p_id uuid, p_action text, p_actor text, p_reason text,
                                              p_runner text, p_at timestamptz, p_lease_until timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := core.ops_actor(p_actor);
  v_at timestamptz := coalesce(p_at, now());
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
      SET status = 'running', lease_owner = p_runner, lease_expires_at = p_lease_until,
          started_at = coalesce(started_at, v_at), rate_window_start = coalesce(rate_window_start, v_at)
      WHERE id = p_id AND status IN ('ready', 'running') AND (lease_owner IS NULL OR lease_expires_at < v_at);
    WHEN 'renew' THEN
      UPDATE core.replay_batches SET lease_expires_at = p_lease_until
      WHERE id = p_id AND lease_owner = p_runner AND status = 'running';
    WHEN 'renew_unexpired' THEN
      UPDATE core.replay_batches SET lease_expires_at = p_lease_until
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
-- Marks a pending item replayed or skipped and counts it on the batch, once.
CREATE OR REPLACE FUNCTION core.ops_batch_record_item(p_id uuid, p_letter uuid, p_state text, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH marked AS (
    UPDATE core.replay_batch_items SET state = p_state, replayed_at = p_at
    WHERE batch_id = p_id AND dead_letter_id = p_letter AND state = 'pending'
    RETURNING 1)
  UPDATE core.replay_batches
  SET replayed = replayed + CASE WHEN p_state = 'replayed' THEN 1 ELSE 0 END,
      skipped = skipped + CASE WHEN p_state = 'skipped' THEN 1 ELSE 0 END
  WHERE id = p_id AND EXISTS (SELECT 1 FROM marked);
END $$;
--> statement-breakpoint
-- What became of a replayed letter d's job, for a batch's recovery proof:
-- whether it has a fence now (succeeded), one older than the replay's claim
-- (duplicate: the work was done before), and whether a later letter of the
-- job and consumer exists whose latest earlier replay is this one (failed
-- again). Plain SQL, no SET clause, so the planner inlines it.
CREATE OR REPLACE FUNCTION core.ops_replay_outcome(p_letter uuid, p_job_id text, p_consumer text, p_claimed_at timestamptz)
RETURNS TABLE (succeeded boolean, duplicate boolean, resolved_at timestamptz, failed boolean)
LANGUAGE sql STABLE AS $$
  SELECT exists (SELECT 1 FROM core.processed_jobs p WHERE p.job_id = p_job_id::uuid AND p.consumer = p_consumer),
         exists (SELECT 1 FROM core.processed_jobs p WHERE p.job_id = p_job_id::uuid AND p.consumer = p_consumer
                 AND p.processed_at < p_claimed_at),
         (SELECT max(t) FROM (SELECT p.processed_at AS t FROM core.processed_jobs p
                              WHERE p.job_id = p_job_id::uuid AND p.consumer = p_consumer
                              UNION ALL
                              SELECT n.created_at FROM core.dead_letters n
                              WHERE n.job_id = p_job_id AND n.consumer = p_consumer AND n.id <> p_letter
                                AND n.created_at >= p_claimed_at) r),
         exists (SELECT 1 FROM core.dead_letters n
                 WHERE n.job_id = p_job_id AND n.consumer = p_consumer AND n.id <> p_letter
                   AND n.created_at >= p_claimed_at
                   AND NOT exists (SELECT 1 FROM core.dead_letters o
                                   WHERE o.job_id = p_job_id AND o.consumer = p_consumer AND o.id <> p_letter
                                     AND o.status = 'replayed'
                                     AND o.status_changed_at > p_claimed_at
                                     AND o.status_changed_at <= n.created_at))
$$;
--> statement-breakpoint
-- Resolves up to p_page of a batch's replayed items (oldest replay first) and
-- counts what it found on the batch's row in the same statement, once.
CREATE OR REPLACE FUNCTION core.ops_batch_resolve(p_id uuid, p_at timestamptz, p_page integer)
RETURNS TABLE (succeeded integer, failed_again integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH page AS (
    SELECT i.dead_letter_id, i.replayed_at, f.failed, f.succeeded, f.duplicate
    FROM core.replay_batch_items i
    JOIN core.dead_letters d ON d.id = i.dead_letter_id
    CROSS JOIN LATERAL core.ops_replay_outcome(d.id, d.job_id, d.consumer, d.status_changed_at) f
    WHERE i.batch_id = p_id AND i.state = 'replayed' AND i.resolution IS NULL
    ORDER BY i.replayed_at
    LIMIT p_page
  ), done AS (
    UPDATE core.replay_batch_items i
    SET resolution = CASE WHEN page.failed THEN 'failed_again' WHEN page.duplicate THEN 'duplicate' ELSE 'succeeded' END
    FROM page
    WHERE i.batch_id = p_id AND i.dead_letter_id = page.dead_letter_id AND i.resolution IS NULL
      AND (page.failed OR page.succeeded)
    RETURNING i.resolution, i.replayed_at
  ), counted AS (
    SELECT count(*) FILTER (WHERE d.resolution = 'succeeded')::integer AS succeeded,
           count(*) FILTER (WHERE d.resolution = 'failed_again')::integer AS failed_again,
           count(*) FILTER (WHERE d.resolution = 'duplicate')::integer AS duplicates,
           count(*) FILTER (WHERE d.resolution = 'succeeded' AND d.replayed_at >= b.rate_window_start)::integer AS window_succeeded,
           count(*) FILTER (WHERE d.resolution = 'failed_again' AND d.replayed_at >= b.rate_window_start)::integer AS window_failed_again,
           count(*) FILTER (WHERE d.resolution = 'duplicate' AND d.replayed_at >= b.rate_window_start)::integer AS window_duplicates
    FROM done d CROSS JOIN (SELECT rate_window_start FROM core.replay_batches WHERE id = p_id) b
  ), bumped AS (
    UPDATE core.replay_batches b
    SET succeeded = b.succeeded + c.succeeded,
        failed_again = b.failed_again + c.failed_again,
        duplicates = b.duplicates + c.duplicates,
        window_succeeded = b.window_succeeded + c.window_succeeded,
        window_failed_again = b.window_failed_again + c.window_failed_again,
        window_duplicates = b.window_duplicates + c.window_duplicates,
        last_resolved_at = p_at
    FROM counted c
    WHERE b.id = p_id AND (c.succeeded > 0 OR c.failed_again > 0 OR c.duplicates > 0)
    RETURNING 1
  )
  SELECT c.succeeded, c.failed_again FROM counted c;
END $$;
--> statement-breakpoint
-- Who may call what. Functions are executable by PUBLIC by default: not these.
REVOKE ALL ON FUNCTION core.ops_audit_write(uuid, timestamptz, text, text, jsonb, text, text),
  core.ops_prune_audit(timestamptz, integer), core.ops_discard_letters(uuid[], text, text),
  core.ops_claim_letter(uuid, text, text, uuid, text), core.ops_create_batch(jsonb, text, boolean, uuid[], integer),
  core.ops_batch_approve(uuid, text, timestamptz),
  core.ops_batch_set(uuid, text, text, text, text, timestamptz, timestamptz),
  core.ops_batch_record_item(uuid, uuid, text, timestamptz), core.ops_batch_resolve(uuid, timestamptz, integer)
  FROM PUBLIC;
--> statement-breakpoint
-- Readers: every listing and `show` (they read the tables; they change nothing).
GRANT USAGE ON SCHEMA core TO softcrum_ops_reader;
--> statement-breakpoint
GRANT SELECT ON core.dead_letters, core.dead_letter_payloads, core.replay_batches, core.replay_batch_items,
  core.ops_audit, core.processed_jobs TO softcrum_ops_reader;
--> statement-breakpoint
-- Operators: replay, discard, batches (create, run, pause, resume, stop), audit prune.
GRANT EXECUTE ON FUNCTION core.ops_audit_write(uuid, timestamptz, text, text, jsonb, text, text),
  core.ops_prune_audit(timestamptz, integer), core.ops_discard_letters(uuid[], text, text),
  core.ops_claim_letter(uuid, text, text, uuid, text), core.ops_create_batch(jsonb, text, boolean, uuid[], integer),
  core.ops_batch_set(uuid, text, text, text, text, timestamptz, timestamptz),
  core.ops_batch_record_item(uuid, uuid, text, timestamptz), core.ops_batch_resolve(uuid, timestamptz, integer)
  TO softcrum_ops_operator;
--> statement-breakpoint
-- Approvers: approve another person's batch (and audit it).
GRANT EXECUTE ON FUNCTION core.ops_batch_approve(uuid, text, timestamptz),
  core.ops_audit_write(uuid, timestamptz, text, text, jsonb, text, text) TO softcrum_ops_approver;
--> statement-breakpoint
-- The HTTP API also counts unauthenticated calls per source and minute (refusals.ts).
GRANT INSERT, UPDATE ON core.ops_audit TO softcrum_ops_service;
--> statement-breakpoint
-- Workers: the fence, dead letters and their keys, holds, the outbox and alert windows; no ops table.
GRANT USAGE ON SCHEMA core TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT, INSERT, UPDATE, DELETE ON core.processed_jobs, core.dead_letter_payloads,
  core.pending_letter_keys, core.transport_holds, core.outbox, core.alert_windows TO softcrum_worker;
--> statement-breakpoint
-- A worker writes a dead letter and counts its repeats (db/dead-letter-write.ts), nothing more: its
-- status, and who changed it, are the operators' (through the functions above).
GRANT SELECT ON core.dead_letters TO softcrum_worker;
--> statement-breakpoint
GRANT INSERT (id, job_id, queue, consumer, payload, payload_encoding, payload_sha256, attempts, last_error,
  error_class, tenant_id, correlation_id, kind) ON core.dead_letters TO softcrum_worker;
--> statement-breakpoint
GRANT UPDATE (occurrences, last_seen_at, last_error, attempts) ON core.dead_letters TO softcrum_worker;
--> statement-breakpoint
-- Workers check at start that the database is migrated (assertMigrated): they read the migration journals.
GRANT USAGE ON SCHEMA drizzle TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT ON ALL TABLES IN SCHEMA drizzle TO softcrum_worker;
--> statement-breakpoint
ALTER DEFAULT PRIVILEGES IN SCHEMA drizzle GRANT SELECT ON TABLES TO softcrum_worker;
