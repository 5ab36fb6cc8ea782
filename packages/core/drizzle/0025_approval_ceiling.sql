-- The two-person rule's ceiling, held by the database too (#21 item 3): a
-- login the database does not trust to name the actor (an operator's own
-- role) can replay without a second person's approval at most 100 letters
-- over 24 hours — the platform's threshold, which SOFTCRUM_OPS_APPROVAL_THRESHOLD
-- can only lower (the library enforces the lower one). Whatever the path, a
-- core.ops_* function called by hand included: a batch over the ceiling is
-- made awaiting approval, and a claim past it is refused.
CREATE OR REPLACE FUNCTION core.ops_unapproved_replays(p_actor text) RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT (SELECT count(*)::integer FROM core.dead_letters
          WHERE status = 'replayed' AND replay_batch_id IS NULL
            AND status_changed_by = p_actor AND status_changed_at >= now() - interval '24 hours')
       + (SELECT count(*)::integer FROM core.replay_batches b
          JOIN core.dead_letters d ON d.replay_batch_id = b.id AND d.status = 'replayed'
          WHERE b.requested_by = p_actor AND b.approved_by IS NULL
            AND b.created_at >= now() - interval '24 hours' - interval '30 days'
            AND d.status_changed_at >= now() - interval '24 hours')
$$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION core.ops_approval_ceiling() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ceiling constant integer := 100;
  unapproved boolean;
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
  -- A claim (or a claim again) of a letter: counted under the requester's quota lock (lockReplayQuota).
  IF NEW.replay_batch_id IS NULL THEN
    unapproved := true;
  ELSE
    SELECT approved_by IS NULL INTO unapproved FROM core.replay_batches WHERE id = NEW.replay_batch_id;
  END IF;
  IF unapproved THEN
    PERFORM pg_advisory_xact_lock(hashtext('softcrum.ops.replay-quota'), hashtext(NEW.status_changed_by));
    IF core.ops_unapproved_replays(NEW.status_changed_by) >= ceiling THEN
      RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('%s replayed %s letters without a second person''s approval in 24 hours: another operator must approve a batch for more',
                         NEW.status_changed_by, ceiling);
    END IF;
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
CREATE TRIGGER ops_approval_ceiling_batch BEFORE INSERT ON core.replay_batches FOR EACH ROW
  EXECUTE FUNCTION core.ops_approval_ceiling();
--> statement-breakpoint
CREATE TRIGGER ops_approval_ceiling_claim BEFORE UPDATE ON core.dead_letters FOR EACH ROW
  WHEN (NEW.status = 'replayed' AND OLD.status_changed_at IS DISTINCT FROM NEW.status_changed_at)
  EXECUTE FUNCTION core.ops_approval_ceiling();
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_approval_ceiling() FROM PUBLIC;
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_unapproved_replays(text) FROM PUBLIC;
