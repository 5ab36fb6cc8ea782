-- Durable commit, at the cost of one check per COMMIT instead of two
-- function calls (each with its own search_path) per row.
-- Fences: the per-row deferred trigger of 0028 on core.processed_jobs goes.
-- Every transaction that commits a fence is a work transaction, and the
-- engine now sends the same setting itself right before its COMMIT, after
-- the handler's last statement (`DURABLE_COMMIT_SQL` in work-transaction.ts):
-- the one mechanism that holds even where a handler's SET CONSTRAINTS ALL
-- IMMEDIATE fired the trigger early. The trigger added a function call per
-- fence at COMMIT, about a tenth of a batched job's server time. (The
-- maintenance that moves protected fences between partitions commits the
-- move and the partition's drop in order: a later durable COMMIT flushes
-- every earlier WAL record, and a crash that loses both loses neither's
-- fences.) Dropped on the partitioned table, its clones on every partition
-- go with it.
-- Dead letters: written on the pool, by the operator's tools and by the
-- engine's decisions, so their trigger stays, with a body that needs no SET
-- clause (every function and operator qualified, so no search_path can
-- shadow them) and calls nothing: `off` becomes the session's own setting
-- (its reset value), or `local`; `local` or stricter stays.
-- The table first, then its partitions, the order every fence insert takes
-- them in: DROP TRIGGER alone locks the partitions (its clones) before the
-- partitioned table, and a live consumer holding the table while it waits
-- for a partition would deadlock with it (seen in the takeover test: every
-- retry timed out). The runner's lock_timeout bounds the wait.
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); taken in the fence inserts' order so DROP TRIGGER cannot deadlock with them
LOCK TABLE "core"."processed_jobs" IN ACCESS EXCLUSIVE MODE;
--> statement-breakpoint
DROP TRIGGER IF EXISTS "processed_jobs_commit_durably" ON "core"."processed_jobs";
--> statement-breakpoint
CREATE OR REPLACE FUNCTION "core"."commit_durably"()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN
    PERFORM pg_catalog.set_config('synchronous_commit',
      COALESCE((SELECT s.reset_val FROM pg_catalog.pg_settings s
        WHERE s.name OPERATOR(pg_catalog.=) 'synchronous_commit'
          AND s.reset_val OPERATOR(pg_catalog.<>) 'off'), 'local'),
      true);
  END IF;
  RETURN NULL;
END
$$;
--> statement-breakpoint
DROP FUNCTION IF EXISTS "core"."commit_durably_now"();
