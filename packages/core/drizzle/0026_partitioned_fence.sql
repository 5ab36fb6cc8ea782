-- softcrum-migrate: no-transaction
-- The fence at internet scale (#23 item 4, ADR 0014): core.processed_jobs
-- becomes range-partitioned by job_id, one partition per UTC day of the
-- UUID v7 time, so the TTL cleanup drops a day in milliseconds instead of
-- deleting ~86M rows a day and bloating the indexes. The primary key
-- (job_id, consumer) holds the partition key: a job's fence stays unique
-- across partitions, and ON CONFLICT DO NOTHING keeps refusing a second one.
--
-- Outside a transaction (ADR 0008), every statement its own, each safe to run
-- again after an interruption:
-- 1. an index on letters that left review, read by a partition's drop;
-- 2. the takeover, one short transaction: the existing table is renamed
--    processed_jobs_default and attached, as it is, as the DEFAULT partition
--    of a new partitioned processed_jobs (no other partition exists, so
--    nothing is scanned; its indexes become the parent's). No row moves and
--    no fence is ever missing; a fence insert waits at most for the
--    runner's lock_timeout, and a prepared one is planned again on the new
--    parent;
-- 3. the functions the maintenance calls (SECURITY DEFINER: the worker role
--    runs the schedule and owns no table);
-- 4. the first day partitions, from the first midnight at least an hour
--    ahead: a CHECK on the default partition, added NOT VALID and validated
--    (a scan that lets every write on), proves it holds no fence of those
--    days, so attaching them scans nothing under an exclusive lock.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "dead_letters_resolved_changed_idx" ON "core"."dead_letters" USING btree ("status_changed_at") WHERE "status" in ('replayed', 'discarded');--> statement-breakpoint
-- The smallest UUID of a UTC day: its midnight's milliseconds in the first 48
-- bits (the UUID v7 time), then zeros. Day partitions are bounded by it.
CREATE OR REPLACE FUNCTION core.fence_day_bound(p_day date) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT (lpad(to_hex((extract(epoch FROM p_day::timestamp) * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid
$$;--> statement-breakpoint
CREATE OR REPLACE FUNCTION core.fence_partition_name(p_day date) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT 'processed_jobs_p' || to_char(p_day, 'YYYYMMDD')
$$;--> statement-breakpoint
DO $$
DECLARE
  v_legacy oid := to_regclass('core.processed_jobs');
  v_owner oid;
  v_pk text;
  v_grant record;
BEGIN
  IF v_legacy IS NULL THEN
    RAISE EXCEPTION 'core.processed_jobs is missing';
  END IF;
  IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid = v_legacy) = 'p' THEN
    RETURN; -- taken over by an earlier run of this file
  END IF;
  -- The existing names move aside so the parent can take them.
  SELECT conname INTO v_pk FROM pg_catalog.pg_constraint WHERE conrelid = v_legacy AND contype = 'p';
  EXECUTE format('ALTER TABLE core.processed_jobs RENAME CONSTRAINT %I TO processed_jobs_default_pkey', v_pk);
  IF to_regclass('core.processed_jobs_expiry_idx') IS NOT NULL THEN
    ALTER INDEX core.processed_jobs_expiry_idx RENAME TO processed_jobs_default_expiry_idx;
  END IF;
  ALTER TABLE core.processed_jobs RENAME TO processed_jobs_default;
  CREATE TABLE core.processed_jobs (
    job_id uuid NOT NULL,
    consumer text NOT NULL,
    processed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT processed_jobs_job_id_consumer_pk PRIMARY KEY (job_id, consumer)
  ) PARTITION BY RANGE (job_id);
  CREATE INDEX processed_jobs_expiry_idx ON core.processed_jobs USING btree (processed_at, job_id, consumer);
  ALTER TABLE core.processed_jobs ATTACH PARTITION core.processed_jobs_default DEFAULT;
  -- Whoever could read or write the fence still can, through the parent.
  SELECT relowner INTO v_owner FROM pg_catalog.pg_class WHERE oid = v_legacy;
  IF v_owner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    EXECUTE format('ALTER TABLE core.processed_jobs OWNER TO %s', v_owner::regrole);
  END IF;
  FOR v_grant IN
    SELECT a.grantee, a.privilege_type, a.is_grantable
    FROM pg_catalog.pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = v_legacy AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT %s ON core.processed_jobs TO %s%s', v_grant.privilege_type,
      CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC' ELSE v_grant.grantee::regrole::text END,
      CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
  END LOOP;
  COMMENT ON TABLE core.processed_jobs IS
    'The idempotency fence, one partition per UTC day of the job_id''s UUID v7 time (processed_jobs_pYYYYMMDD) and processed_jobs_default (migration 0026, ADR 0014)';
END $$;--> statement-breakpoint
-- Step 1 of creating day partitions (the maintenance's ensureFencePartitions,
-- and this file below): picks the days from p_first (default: the first
-- midnight at least an hour ahead, so no live fence can belong to it yet) to
-- p_last (default: today + p_days_ahead, UTC) that have no partition and no
-- fence in the default partition (an index probe each), at most 25 days from
-- the first, and adds to the default partition one CHECK, NOT VALID,
-- excluding them (a range per run of consecutive days). Its name says which
-- days: processed_jobs_default_ahead_<first day>_<one 0/1 per day>. Returns
-- it (NULL: nothing to create). Any other such CHECK, left by an interrupted
-- run, is dropped. Serialised with step 3 by an advisory lock.
CREATE OR REPLACE FUNCTION core.fence_partitions_prepare(p_days_ahead integer, p_first date DEFAULT NULL,
  p_last date DEFAULT NULL, p_lock_timeout_ms integer DEFAULT 500) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_first date := coalesce(p_first, ((now() + interval '1 hour') AT TIME ZONE 'UTC')::date + 1);
  v_last date := coalesce(p_last, (now() AT TIME ZONE 'UTC')::date + p_days_ahead);
  v_day date;
  v_start date;
  v_run date;
  v_bits text := '';
  v_ranges text[] := ARRAY[]::text[];
  v_free boolean;
  v_name text;
  v_stale text;
BEGIN
  IF p_days_ahead IS NULL OR p_days_ahead < 0 OR p_days_ahead > 366 OR v_last - v_first > 400 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('fence partitions: days ahead must be from 0 to 366 and a range at most 400 days, got %s (%s to %s)',
                       p_days_ahead, v_first, v_last);
  END IF;
  PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
  PERFORM pg_advisory_xact_lock(7318114622095046023);
  v_day := v_first;
  WHILE v_day <= v_last AND length(v_bits) < 25 LOOP
    v_free := to_regclass('core.' || core.fence_partition_name(v_day)) IS NULL
      AND NOT EXISTS (SELECT 1 FROM core.processed_jobs_default
                      WHERE job_id >= core.fence_day_bound(v_day) AND job_id < core.fence_day_bound(v_day + 1));
    IF v_free THEN
      v_start := coalesce(v_start, v_day);
      v_run := coalesce(v_run, v_day);
    ELSIF v_run IS NOT NULL THEN
      v_ranges := v_ranges || format('(job_id < %L::uuid OR job_id >= %L::uuid)', core.fence_day_bound(v_run), core.fence_day_bound(v_day));
      v_run := NULL;
    END IF;
    IF v_start IS NOT NULL THEN
      v_bits := v_bits || CASE WHEN v_free THEN '1' ELSE '0' END;
    END IF;
    v_day := v_day + 1;
  END LOOP;
  IF v_run IS NOT NULL THEN
    v_ranges := v_ranges || format('(job_id < %L::uuid OR job_id >= %L::uuid)', core.fence_day_bound(v_run), core.fence_day_bound(v_day));
  END IF;
  IF v_start IS NOT NULL THEN
    v_name := 'processed_jobs_default_ahead_' || to_char(v_start, 'YYYYMMDD') || '_' || rtrim(v_bits, '0');
  END IF;
  FOR v_stale IN
    SELECT conname FROM pg_constraint
    WHERE conrelid = 'core.processed_jobs_default'::regclass AND conname LIKE 'processed\_jobs\_default\_ahead\_%'
      AND conname IS DISTINCT FROM v_name
  LOOP
    EXECUTE format('ALTER TABLE core.processed_jobs_default DROP CONSTRAINT %I', v_stale);
  END LOOP;
  IF v_name IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM pg_constraint WHERE conrelid = 'core.processed_jobs_default'::regclass AND conname = v_name
  ) THEN
    EXECUTE format('ALTER TABLE core.processed_jobs_default ADD CONSTRAINT %I CHECK (%s) NOT VALID',
                   v_name, array_to_string(v_ranges, ' AND '));
  END IF;
  RETURN v_name;
END $$;--> statement-breakpoint
-- Step 2: validates that CHECK, in a statement of its own. VALIDATE scans the
-- default partition under SHARE UPDATE EXCLUSIVE, which lets every insert and
-- delete on (it waits up to p_wait_ms for that lock: only DDL and a vacuum
-- hold it). A fence of those days found there after all means the CHECK is
-- dropped (it would refuse that day's fences) and 'violated' is returned.
CREATE OR REPLACE FUNCTION core.fence_partitions_validate(p_wait_ms integer DEFAULT 30000,
  p_lock_timeout_ms integer DEFAULT 500) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_name text;
  v_valid boolean;
BEGIN
  SELECT conname, convalidated INTO v_name, v_valid FROM pg_constraint
  WHERE conrelid = 'core.processed_jobs_default'::regclass AND conname LIKE 'processed\_jobs\_default\_ahead\_%'
  ORDER BY conname LIMIT 1;
  IF v_name IS NULL THEN
    RETURN 'none';
  ELSIF v_valid THEN
    RETURN 'valid';
  END IF;
  PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
  BEGIN
    EXECUTE format('ALTER TABLE core.processed_jobs_default VALIDATE CONSTRAINT %I', v_name);
  EXCEPTION
    WHEN undefined_object THEN
      RETURN 'none';
    WHEN check_violation THEN
      PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
      EXECUTE format('ALTER TABLE core.processed_jobs_default DROP CONSTRAINT IF EXISTS %I', v_name);
      RETURN 'violated';
  END;
  RETURN 'valid';
END $$;--> statement-breakpoint
-- Step 3: creates and attaches the partitions of the validated CHECK's days,
-- then drops the CHECK, in one short transaction: ATTACH takes SHARE UPDATE
-- EXCLUSIVE on the parent (fence inserts go on) and, for a moment, ACCESS
-- EXCLUSIVE on the default partition, which the CHECK spares a scan. Returns
-- how many were created; -1 when the CHECK is not validated yet.
CREATE OR REPLACE FUNCTION core.fence_partitions_attach(p_lock_timeout_ms integer DEFAULT 500) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_name text;
  v_valid boolean;
  v_first date;
  v_bits text;
  v_day date;
  v_part text;
  n integer := 0;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
  PERFORM pg_advisory_xact_lock(7318114622095046023);
  SELECT conname, convalidated INTO v_name, v_valid FROM pg_constraint
  WHERE conrelid = 'core.processed_jobs_default'::regclass AND conname LIKE 'processed\_jobs\_default\_ahead\_%'
  ORDER BY conname LIMIT 1;
  IF v_name IS NULL THEN
    RETURN 0;
  ELSIF NOT v_valid THEN
    RETURN -1;
  END IF;
  v_first := to_date(substr(v_name, 30, 8), 'YYYYMMDD');
  v_bits := substr(v_name, 39);
  FOR i IN 1 .. length(v_bits) LOOP
    CONTINUE WHEN substr(v_bits, i, 1) <> '1';
    v_day := v_first + (i - 1);
    v_part := core.fence_partition_name(v_day);
    IF to_regclass('core.' || v_part) IS NULL THEN
      EXECUTE format('CREATE TABLE core.%I (LIKE core.processed_jobs INCLUDING DEFAULTS)', v_part);
      EXECUTE format('ALTER TABLE core.processed_jobs ATTACH PARTITION core.%I FOR VALUES FROM (%L) TO (%L)',
                     v_part, core.fence_day_bound(v_day), core.fence_day_bound(v_day + 1));
      n := n + 1;
    END IF;
  END LOOP;
  EXECUTE format('ALTER TABLE core.processed_jobs_default DROP CONSTRAINT %I', v_name);
  RETURN n;
END $$;--> statement-breakpoint
-- A day partition whose whole day is past the TTL leaves, in ONE transaction:
-- DETACH (ACCESS EXCLUSIVE on the parent for a moment: a fence insert of a
-- job of that day waits, then lands in the default partition), then every
-- fence the TTL cleanup would keep is inserted again through the parent (so
-- into the default partition): written less than a TTL ago (a replayed or
-- late copy of an old job), of a job with a pending dead letter, or with a
-- letter replayed or discarded less than a TTL ago. Each is read through an
-- index: the partition's expiry index, the letters' status indexes, then the
-- partition's primary key. A fence insert that waited conflicts with the
-- moved row exactly as it would have with the dropped one. The detached table
-- is dropped by core.fence_partition_drop_detached, in a statement of its own.
-- The caller checks first that no fence of another module's consumers is in
-- it. p_dry_run counts what would move, without a lock.
CREATE OR REPLACE FUNCTION core.fence_partition_detach(p_day date, p_ttl_seconds double precision,
  p_dry_run boolean DEFAULT false, p_lock_timeout_ms integer DEFAULT 500)
RETURNS TABLE (detached boolean, moved bigint, moved_pending bigint, moved_replays bigint, moved_recent bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_part text := core.fence_partition_name(p_day);
  v_since timestamptz;
  v_kept text;
BEGIN
  IF p_ttl_seconds IS NULL OR NOT p_ttl_seconds > 0 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('fence partitions: the TTL must be positive, got %s', p_ttl_seconds);
  END IF;
  v_since := now() - make_interval(secs => p_ttl_seconds);
  IF ((p_day + 1)::timestamp AT TIME ZONE 'UTC') > v_since THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('fence partitions: %s is not past the TTL yet', p_day);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_inherits
                 WHERE inhparent = 'core.processed_jobs'::regclass AND inhrelid = to_regclass('core.' || v_part)) THEN
    RETURN QUERY SELECT false, 0::bigint, 0::bigint, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  IF NOT p_dry_run THEN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE format('ALTER TABLE core.processed_jobs DETACH PARTITION core.%I', v_part);
  END IF;
  v_kept := format($q$
    WITH letters AS (
      -- Letters of the day's jobs: job ids are lowercase canonical UUIDs
      -- (the envelope lowercases them, as the cleanup's batches compare
      -- them), so the day is a range of their text too.
      SELECT CASE WHEN l.job_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN l.job_id::uuid END AS job_id,
             bool_or(l.pending) AS pending
      FROM (
        SELECT d.job_id, true AS pending FROM core.dead_letters d
        WHERE d.status = 'pending_review' AND d.job_id COLLATE "C" >= $2::text AND d.job_id COLLATE "C" < $3::text
        UNION ALL
        SELECT d.job_id, false FROM core.dead_letters d
        WHERE d.status IN ('replayed', 'discarded') AND d.status_changed_at >= $1
          AND d.job_id COLLATE "C" >= $2::text AND d.job_id COLLATE "C" < $3::text
      ) l
      GROUP BY l.job_id
    ), kept AS (
      SELECT p.job_id, p.consumer, p.processed_at FROM core.%1$I p WHERE p.processed_at >= $1
      UNION
      SELECT p.job_id, p.consumer, p.processed_at FROM letters l JOIN core.%1$I p ON p.job_id = l.job_id
    ), classified AS (
      SELECT k.job_id, k.consumer, k.processed_at, coalesce(l.pending, false) AS pending, l.job_id IS NOT NULL AS lettered
      FROM kept k LEFT JOIN letters l ON l.job_id = k.job_id
    )$q$, v_part);
  IF p_dry_run THEN
    RETURN QUERY EXECUTE v_kept || $q$
      SELECT false, count(*), count(*) FILTER (WHERE pending), count(*) FILTER (WHERE lettered AND NOT pending),
             count(*) FILTER (WHERE NOT lettered)
      FROM classified$q$
      USING v_since, core.fence_day_bound(p_day), core.fence_day_bound(p_day + 1);
  ELSE
    RETURN QUERY EXECUTE v_kept || $q$, moved AS (
        INSERT INTO core.processed_jobs (job_id, consumer, processed_at)
        SELECT job_id, consumer, processed_at FROM classified
        ON CONFLICT DO NOTHING RETURNING 1
      )
      SELECT true, (SELECT count(*) FROM moved), count(*) FILTER (WHERE pending),
             count(*) FILTER (WHERE lettered AND NOT pending), count(*) FILTER (WHERE NOT lettered)
      FROM classified$q$
      USING v_since, core.fence_day_bound(p_day), core.fence_day_bound(p_day + 1);
  END IF;
END $$;--> statement-breakpoint
-- Drops a day partition that core.fence_partition_detach detached (its kept
-- fences moved in the detach's own transaction): ACCESS EXCLUSIVE on that
-- table only, which nothing else uses any more; the files go at commit,
-- whatever their size. Also drops one an interrupted run left detached.
CREATE OR REPLACE FUNCTION core.fence_partition_drop_detached(p_day date, p_lock_timeout_ms integer DEFAULT 500)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_part text := core.fence_partition_name(p_day);
  v_rel regclass := to_regclass('core.' || core.fence_partition_name(p_day));
BEGIN
  IF v_rel IS NULL THEN
    RETURN false;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = v_rel) THEN
    RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format('fence partitions: %s is still attached', v_part);
  END IF;
  IF p_day >= (now() AT TIME ZONE 'UTC')::date THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('fence partitions: %s is not a past day', v_part);
  END IF;
  PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
  EXECUTE format('DROP TABLE core.%I', v_part);
  RETURN true;
END $$;--> statement-breakpoint
REVOKE ALL ON FUNCTION core.fence_partitions_prepare(integer, date, date, integer),
  core.fence_partitions_validate(integer, integer), core.fence_partitions_attach(integer),
  core.fence_partition_detach(date, double precision, boolean, integer),
  core.fence_partition_drop_detached(date, integer) FROM PUBLIC;--> statement-breakpoint
-- The worker role runs the scheduled cleanup (ADR 0014).
GRANT EXECUTE ON FUNCTION core.fence_partitions_prepare(integer, date, date, integer),
  core.fence_partitions_validate(integer, integer), core.fence_partitions_attach(integer),
  core.fence_partition_detach(date, double precision, boolean, integer),
  core.fence_partition_drop_detached(date, integer) TO softcrum_worker;--> statement-breakpoint
-- The first week of day partitions (the maintenance keeps it a week ahead).
SELECT core.fence_partitions_prepare(7);--> statement-breakpoint
SELECT core.fence_partitions_validate();--> statement-breakpoint
SELECT core.fence_partitions_attach();
