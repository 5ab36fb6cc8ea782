-- The pending-letter part of core.fence_opened (migration 0011) alone, for the
-- pipelined work transaction (packages/core/src/db/work-transaction.ts,
-- FENCE_SQL): that path sets the transaction's server-side bounds in its BEGIN
-- instead (`begin; set local ...`, one simple-protocol message, no planning),
-- which costs the server nothing measurable where set_config() inside plpgsql
-- cost about 2% of the benchmark's raw rate (#8: ratio_raw). The Drizzle path
-- calls set_config() itself before the ordering lock. fence_opened is no longer
-- called; it stays so that workers of the previous release keep working while
-- a deploy rolls out.
-- VOLATILE, so in READ COMMITTED its query takes a fresh snapshot when it runs:
-- after the fence insert finished waiting on a concurrent holder of the fence
-- key (a dead-letter decision), it sees the letter that holder committed.
-- FOR SHARE waits for a replay changing the letter's status right now.
CREATE OR REPLACE FUNCTION "core"."pending_letter"(p_job_id uuid, p_consumer text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
  detail text;
BEGIN
  SELECT id::text || ' ' || error_class INTO detail
    FROM core.dead_letters
   WHERE job_id = p_job_id::text AND consumer = p_consumer AND status = 'pending_review'
   LIMIT 1
     FOR SHARE;
  RETURN detail;
END
$$;
