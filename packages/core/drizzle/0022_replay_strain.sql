ALTER TABLE "core"."replay_batches" ADD COLUMN "max_rate_limited_multiple" double precision DEFAULT 3 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD COLUMN "max_latency_multiple" double precision DEFAULT 3 NOT NULL;--> statement-breakpoint
ALTER TABLE "core"."replay_batches" ADD CONSTRAINT "replay_batches_strain_multiples_range" CHECK ("core"."replay_batches"."max_rate_limited_multiple" >= 1 and "core"."replay_batches"."max_rate_limited_multiple" <= 100 and "core"."replay_batches"."max_latency_multiple" >= 1 and "core"."replay_batches"."max_latency_multiple" <= 100);--> statement-breakpoint
-- As in 0021, plus the strain thresholds.
CREATE OR REPLACE FUNCTION core.ops_create_batch(p_batch jsonb, p_actor text, p_needs_approval boolean,
                                                 p_letters uuid[], p_sample integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r core.replay_batches;
BEGIN
  r := jsonb_populate_record(NULL::core.replay_batches, p_batch);
  INSERT INTO core.replay_batches (id, status, filter, requested_by, reason, rate_per_second, rate_share, rate_floor,
                                   batch_size, sample_size, max_failure_rate, max_duplicate_rate, expires_at,
                                   selected, created_at, consumer_versions,
                                   max_rate_limited_multiple, max_latency_multiple)
  VALUES (r.id, CASE WHEN p_needs_approval THEN 'awaiting_approval' ELSE 'ready' END, r.filter,
          core.ops_actor(p_actor), r.reason, r.rate_per_second, r.rate_share, r.rate_floor, r.batch_size,
          r.sample_size, r.max_failure_rate, r.max_duplicate_rate, r.expires_at,
          coalesce(cardinality(p_letters), 0), core.ops_time(r.created_at), r.consumer_versions,
          coalesce(r.max_rate_limited_multiple, 3), coalesce(r.max_latency_multiple, 3));
  INSERT INTO core.replay_batch_items (batch_id, dead_letter_id, position, in_sample)
  SELECT r.id, l.id, (l.n - 1)::integer, l.n <= coalesce(p_sample, 0)
  FROM unnest(p_letters) WITH ORDINALITY AS l(id, n);
END $$;
