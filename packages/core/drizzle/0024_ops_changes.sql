CREATE TABLE "core"."ops_changes" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"login" text NOT NULL,
	"actor" text,
	"change" text NOT NULL,
	"target" uuid,
	"from_state" text,
	"to_state" text,
	"detail" text
);
--> statement-breakpoint
CREATE INDEX "ops_changes_at_idx" ON "core"."ops_changes" USING btree ("at");--> statement-breakpoint
CREATE INDEX "ops_changes_target_idx" ON "core"."ops_changes" USING btree ("target");--> statement-breakpoint
-- Written by these triggers only, whatever made the change (a core.ops_* function, the owner):
-- a session can read it, never type, change or delete a row (#21 item 3).
CREATE OR REPLACE FUNCTION core.ops_changes_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_TABLE_NAME = 'dead_letters' THEN
    INSERT INTO core.ops_changes (login, actor, change, target, from_state, to_state, detail)
    VALUES (session_user, NEW.status_changed_by, 'dead_letter.status', NEW.id, OLD.status, NEW.status,
            left(NEW.status_reason, 500));
  ELSIF TG_TABLE_NAME = 'replay_batches' AND TG_OP = 'INSERT' THEN
    INSERT INTO core.ops_changes (login, actor, change, target, to_state, detail)
    VALUES (session_user, NEW.requested_by, 'replay_batch.created', NEW.id, NEW.status, left(NEW.reason, 500));
  ELSIF TG_TABLE_NAME = 'replay_batches' AND NEW.approved_by IS DISTINCT FROM OLD.approved_by THEN
    INSERT INTO core.ops_changes (login, actor, change, target, from_state, to_state)
    VALUES (session_user, NEW.approved_by, 'replay_batch.approved', NEW.id, OLD.status, NEW.status);
  ELSIF TG_TABLE_NAME = 'replay_batches' THEN
    INSERT INTO core.ops_changes (login, actor, change, target, from_state, to_state, detail)
    VALUES (session_user, NULL, 'replay_batch.status', NEW.id, OLD.status, NEW.status, left(NEW.stop_reason, 500));
  END IF;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION core.ops_changes_audit_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n integer;
  newest timestamptz;
BEGIN
  SELECT count(*), max(at) INTO n, newest FROM gone;
  IF n > 0 THEN
    INSERT INTO core.ops_changes (login, change, detail)
    VALUES (session_user, 'ops_audit.deleted', format('%s entries, the newest at %s', n, newest));
  END IF;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER ops_changes_dead_letter_status AFTER UPDATE ON core.dead_letters FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.status_changed_at IS DISTINCT FROM NEW.status_changed_at)
  EXECUTE FUNCTION core.ops_changes_record();
--> statement-breakpoint
CREATE TRIGGER ops_changes_batch_created AFTER INSERT ON core.replay_batches FOR EACH ROW
  EXECUTE FUNCTION core.ops_changes_record();
--> statement-breakpoint
CREATE TRIGGER ops_changes_batch_state AFTER UPDATE ON core.replay_batches FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.approved_by IS DISTINCT FROM NEW.approved_by)
  EXECUTE FUNCTION core.ops_changes_record();
--> statement-breakpoint
CREATE TRIGGER ops_changes_audit_deleted AFTER DELETE ON core.ops_audit REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION core.ops_changes_audit_deleted();
--> statement-breakpoint
REVOKE ALL ON FUNCTION core.ops_changes_record(), core.ops_changes_audit_deleted() FROM PUBLIC;
--> statement-breakpoint
GRANT SELECT ON core.ops_changes TO softcrum_ops_reader;
