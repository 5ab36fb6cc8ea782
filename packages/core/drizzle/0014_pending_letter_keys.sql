CREATE TABLE "core"."pending_letter_keys" (
	"job_id" text NOT NULL,
	"consumer" text NOT NULL,
	"dead_letter_id" uuid NOT NULL,
	"error_class" text NOT NULL,
	CONSTRAINT "pending_letter_keys_job_id_consumer_pk" PRIMARY KEY("job_id","consumer")
);
--> statement-breakpoint
ALTER TABLE "core"."pending_letter_keys" ADD CONSTRAINT "pending_letter_keys_dead_letter_id_dead_letters_id_fk" FOREIGN KEY ("dead_letter_id") REFERENCES "core"."dead_letters"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "pending_letter_keys_dead_letter_id" ON "core"."pending_letter_keys" USING btree ("dead_letter_id");--> statement-breakpoint
-- The keys of pending letters, kept by core.dead_letters' own triggers in
-- the transaction that writes the letter (#18 item 6). The fence's
-- pending-letter check reads this small table instead of core.dead_letters:
-- a work transaction then holds no lock on the letters' table for its whole
-- handler run, and a migration of core.dead_letters never waits on live jobs.
-- The guarantee is the same: the dead-letter decision inserts the letter (so
-- its key) while it holds the fence key; a replay or a discard that changes
-- the letter's status deletes the key in its own transaction, so the check's
-- FOR SHARE waits for it and reads what it committed. Deleted letters take
-- their keys with them (ON DELETE CASCADE; TRUNCATE ... CASCADE too).
-- Statement triggers with transition tables: a batch replay of 100,000
-- letters is one join, not 100,000 trigger calls.
CREATE OR REPLACE FUNCTION "core"."pending_letter_keys_sync"()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    DELETE FROM core.pending_letter_keys k
     USING new_letters n
     WHERE k.dead_letter_id = n.id
       AND (n.status <> 'pending_review' OR n.job_id IS NULL OR k.job_id <> n.job_id OR k.consumer <> n.consumer);
  END IF;
  INSERT INTO core.pending_letter_keys AS k (job_id, consumer, dead_letter_id, error_class)
  SELECT n.job_id, n.consumer, n.id, n.error_class
    FROM new_letters n
   WHERE n.status = 'pending_review' AND n.job_id IS NOT NULL
  ON CONFLICT (job_id, consumer) DO UPDATE
    SET dead_letter_id = excluded.dead_letter_id, error_class = excluded.error_class
    WHERE (k.dead_letter_id, k.error_class) IS DISTINCT FROM (excluded.dead_letter_id, excluded.error_class);
  RETURN NULL;
END
$$;
--> statement-breakpoint
CREATE TRIGGER "dead_letters_pending_keys_insert" AFTER INSERT ON "core"."dead_letters"
  REFERENCING NEW TABLE AS new_letters
  FOR EACH STATEMENT EXECUTE FUNCTION "core"."pending_letter_keys_sync"();
--> statement-breakpoint
CREATE TRIGGER "dead_letters_pending_keys_update" AFTER UPDATE ON "core"."dead_letters"
  REFERENCING NEW TABLE AS new_letters
  FOR EACH STATEMENT EXECUTE FUNCTION "core"."pending_letter_keys_sync"();
--> statement-breakpoint
INSERT INTO "core"."pending_letter_keys" (job_id, consumer, dead_letter_id, error_class)
SELECT job_id, consumer, id, error_class FROM "core"."dead_letters"
 WHERE status = 'pending_review' AND job_id IS NOT NULL
ON CONFLICT (job_id, consumer) DO NOTHING;
--> statement-breakpoint
-- Same answer as migration 0012's, from the keys. VOLATILE, so under READ
-- COMMITTED its query takes a fresh snapshot when it runs, after the fence
-- insert finished waiting on a dead-letter decision holding the fence key.
CREATE OR REPLACE FUNCTION "core"."pending_letter"(p_job_id uuid, p_consumer text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
  detail text;
BEGIN
  SELECT dead_letter_id::text || ' ' || error_class INTO detail
    FROM core.pending_letter_keys
   WHERE job_id = p_job_id::text AND consumer = p_consumer
     FOR SHARE;
  RETURN detail;
END
$$;
