-- Replaying again a letter whose replay never ran (#21 item 4): it is
-- `replayed`, yet its job has neither a fence nor a newer letter of the same
-- consumer since the replay (ops_replay_outcome) — the copy was lost (an
-- in-process queue killed mid-way, a transport that lost it). The letter is
-- claimed again, under the session's role, in the transaction that
-- publishes; a replay that did run (or runs meanwhile) is never claimed.
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
      AND NOT EXISTS (SELECT 1 FROM core.ops_replay_outcome(d.id, d.job_id, d.consumer, d.status_changed_at) f
                      WHERE f.succeeded OR f.failed)
    RETURNING d.queue, d.consumer;
END $$;
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_reclaim_letter(uuid, text, text) FROM PUBLIC;
--> statement-breakpoint
GRANT EXECUTE ON FUNCTION core.ops_reclaim_letter(uuid, text, text) TO softcrum_ops_operator;
