-- How far the fence TTL cleanup has deleted, per consumer (schema.ts
-- fenceHorizons): the cleanup writes the cutoff it deletes with, in the same
-- statement or transaction as the deletion, so the horizon commits with what
-- it deleted and is never behind it.
CREATE TABLE "core"."fence_horizons" (
	"consumer" text PRIMARY KEY NOT NULL,
	"cleaned_before" timestamp with time zone NOT NULL
);
--> statement-breakpoint
-- The cleanup runs as the worker (it deletes the worker's fences); readers see it.
GRANT SELECT, INSERT, UPDATE ON core.fence_horizons TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT ON core.fence_horizons TO softcrum_ops_reader;
--> statement-breakpoint
-- Replaying again (migration 0019) trusts "no fence and no newer letter since
-- the replay" to mean the replay never ran. A fence the replay wrote is kept
-- by the cleanup for a TTL after the replay, then deleted like any other: a
-- letter replayed before the consumer's horizon may have run, its fence gone,
-- and replaying it again would run the job twice. Such a letter is never
-- claimed again (replay-claim.ts says why).
CREATE OR REPLACE FUNCTION core.ops_reclaim_letter(p_id uuid, p_actor text, p_reason text)
RETURNS TABLE (queue text, consumer text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_actor text := core.ops_actor(p_actor);
BEGIN
  RETURN QUERY
    UPDATE core.dead_letters d
    SET status_changed_at = now(), status_changed_by = v_actor, status_reason = p_reason, replay_batch_id = NULL
    WHERE d.id = p_id AND d.status = 'replayed'
      AND NOT EXISTS (SELECT 1 FROM core.fence_horizons h
                      WHERE h.consumer = d.consumer AND d.status_changed_at < h.cleaned_before)
      AND NOT EXISTS (SELECT 1 FROM core.ops_replay_outcome(d.id, d.job_id, d.consumer, d.status_changed_at) f
                      WHERE f.succeeded OR f.failed)
    RETURNING d.queue, d.consumer;
END $$;
