CREATE TABLE "core"."consumer_versions" (
	"queue" text NOT NULL,
	"consumer" text NOT NULL,
	"version" text NOT NULL,
	"kinds" text[] DEFAULT '{}'::text[] NOT NULL,
	"reported_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "consumer_versions_queue_consumer_pk" PRIMARY KEY("queue","consumer"),
	CONSTRAINT "consumer_versions_version_given" CHECK (btrim("core"."consumer_versions"."version") <> '' and char_length("core"."consumer_versions"."version") <= 200)
);
--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN "consumer_versions" jsonb;--> statement-breakpoint
-- Workers report their consumers' versions at start; readers see them.
GRANT SELECT, INSERT, UPDATE ON core.consumer_versions TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT ON core.consumer_versions TO softcrum_ops_reader;
--> statement-breakpoint
-- As in 0018, plus the consumers' versions the batch is made for.
CREATE OR REPLACE FUNCTION core.ops_create_batch(p_batch jsonb, p_actor text, p_needs_approval boolean,
                                                 p_letters uuid[], p_sample integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r core.replay_batches;
BEGIN
  r := jsonb_populate_record(NULL::core.replay_batches, p_batch);
  INSERT INTO core.replay_batches (id, status, filter, requested_by, reason, rate_per_second, rate_share, rate_floor,
                                   batch_size, sample_size, max_failure_rate, max_duplicate_rate, expires_at,
                                   selected, created_at, consumer_versions)
  VALUES (r.id, CASE WHEN p_needs_approval THEN 'awaiting_approval' ELSE 'ready' END, r.filter,
          core.ops_actor(p_actor), r.reason, r.rate_per_second, r.rate_share, r.rate_floor, r.batch_size,
          r.sample_size, r.max_failure_rate, r.max_duplicate_rate, r.expires_at,
          coalesce(cardinality(p_letters), 0), core.ops_time(r.created_at), r.consumer_versions);
  INSERT INTO core.replay_batch_items (batch_id, dead_letter_id, position, in_sample)
  SELECT r.id, l.id, (l.n - 1)::integer, l.n <= coalesce(p_sample, 0)
  FROM unnest(p_letters) WITH ORDINALITY AS l(id, n);
END $$;
