-- A transaction that writes a fence or a dead letter commits only once its
-- WAL is flushed, whatever anyone set: the database or the role (read by a
-- new connection at any time, not once per pool), the connection, or the
-- handler inside the work transaction (`SET LOCAL synchronous_commit = off`,
-- `set_config`, a function). With `synchronous_commit = off` a COMMIT
-- answers before its WAL reaches the disk, and a server crash right after
-- loses what the harness has acknowledged: a fence and its work, or the
-- dead letter of a job whose message is gone — a job lost without a trace.
-- So each such row queues a deferred trigger, which runs inside COMMIT after
-- every statement of the transaction and, when it finds `off`, sets the
-- session's own setting back (its value before any SET: the database's, the
-- role's or the connection's), or `local` (the least that survives a crash of
-- this server) when that is `off` too. `local` or stricter (`on`,
-- `remote_write`, `remote_apply`) stays as it is. The trigger on the
-- partitioned fence is cloned onto every partition, those attached later too.
-- (Migration 0027's replica check stands: in replica mode no ordinary
-- trigger fires, and the harness runs no work transaction and writes no
-- dead letter there.)
-- The harness also does what core.commit_durably_now() does itself, right
-- before every COMMIT of a work transaction (after the handler's last
-- statement; `DURABLE_COMMIT_SQL` in work-transaction.ts): a handler's
-- `SET CONSTRAINTS ALL IMMEDIATE` fires the trigger early, and a
-- `SET LOCAL synchronous_commit = off` after it would otherwise hold.
-- Both run with a fixed search_path: a handler's `SET LOCAL search_path`
-- cannot put a current_setting() of its own in front of pg_catalog's. (A
-- function's SET clause scopes only search_path; the synchronous_commit it
-- sets stays for the transaction.)
CREATE OR REPLACE FUNCTION "core"."commit_durably_now"()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_session text;
BEGIN
  IF current_setting('synchronous_commit') = 'off' THEN
    SELECT reset_val INTO v_session FROM pg_catalog.pg_settings WHERE name = 'synchronous_commit';
    PERFORM set_config('synchronous_commit',
      CASE WHEN v_session IS NULL OR v_session = 'off' THEN 'local' ELSE v_session END, true);
  END IF;
  RETURN true;
END
$$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION "core"."commit_durably"()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM core.commit_durably_now();
  RETURN NULL;
END
$$;
--> statement-breakpoint
CREATE CONSTRAINT TRIGGER "processed_jobs_commit_durably"
  AFTER INSERT ON "core"."processed_jobs"
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION "core"."commit_durably"();
--> statement-breakpoint
CREATE CONSTRAINT TRIGGER "dead_letters_commit_durably"
  AFTER INSERT OR UPDATE ON "core"."dead_letters"
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION "core"."commit_durably"();
