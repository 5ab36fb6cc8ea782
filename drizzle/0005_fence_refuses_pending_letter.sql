-- A job never ends with both a committed fence and a pending_review dead
-- letter (SPEC §4). Checked when the work transaction commits, not before:
-- a dead letter written by a concurrent delivery while the handler ran is
-- seen here, and FOR SHARE waits for a replay that is changing the letter's
-- status right now (it publishes before it commits) and reads the status it
-- committed. The dead-letter decision inserts a probe fence to wait on a work
-- transaction of the same job and deletes it before committing: a fence row
-- that is gone is not checked.
CREATE FUNCTION "core"."fence_refuses_pending_letter"() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  letter record;
BEGIN
  PERFORM 1 FROM "core"."processed_jobs" WHERE "job_id" = NEW."job_id" AND "consumer" = NEW."consumer";
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  SELECT "id", "error_class" INTO letter FROM "core"."dead_letters"
    WHERE "job_id" = NEW."job_id"::text AND "consumer" = NEW."consumer" AND "status" = 'pending_review'
    LIMIT 1 FOR SHARE;
  IF FOUND THEN
    RAISE EXCEPTION 'job % has a pending dead letter for consumer %: its work is not committed', NEW."job_id", NEW."consumer"
      USING ERRCODE = 'SC001', DETAIL = letter."id"::text || ' ' || letter."error_class";
  END IF;
  RETURN NULL;
END
$$;--> statement-breakpoint
CREATE CONSTRAINT TRIGGER "fence_refuses_pending_letter" AFTER INSERT ON "core"."processed_jobs"
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "core"."fence_refuses_pending_letter"();
