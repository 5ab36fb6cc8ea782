/**
 * A replay batch paced as a share of live traffic (#21 item 5, seed 002):
 * instead of a fixed rate, the batch replays a share of what its consumers
 * process live — the fences they wrote over the last minute, the replays' own
 * left out — between a floor and a ceiling, re-evaluated at every chunk. A
 * consumer that slows down (its dependency strains) slows the replay with it.
 */
import { sql } from "drizzle-orm";
import type { AnyPgDatabase } from "../db/types.ts";
import { rowsOf } from "./operations.ts";

/** The window live throughput is measured over. */
export const LIVE_WINDOW_SECONDS = 60;

/** The consumers a batch replays to (once per run: a batch's letters do not change). */
export async function batchConsumers(db: Pick<AnyPgDatabase, "execute">, batchId: string): Promise<string[]> {
  const result = await db.execute(sql`
    select distinct d.consumer from core.replay_batch_items i
    join core.dead_letters d on d.id = i.dead_letter_id
    where i.batch_id = ${batchId}`);
  return rowsOf<{ consumer: string }>(result).map((row) => row.consumer);
}

/**
 * Jobs per second `consumers` processed live over the last LIVE_WINDOW_SECONDS
 * (database time): their fences in the window, less those of replayed
 * letters (a replay's success is not live traffic).
 */
export async function liveRatePerSecond(
  db: Pick<AnyPgDatabase, "execute">,
  consumers: readonly string[],
): Promise<number> {
  if (consumers.length === 0) return 0;
  const list = sql.join(
    consumers.map((c) => sql`${c}`),
    sql`, `,
  );
  const result = await db.execute(sql`
    select
      (select count(*)::int from core.processed_jobs p
       where p.processed_at > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS}) and p.consumer in (${list}))
      -
      (select count(*)::int from core.dead_letters d
       join core.processed_jobs p on p.job_id = d.job_id::uuid and p.consumer = d.consumer
       where d.status = 'replayed' and d.replay_batch_id is not null and d.consumer in (${list})
         and d.status_changed_at > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS} * 2)
         and p.processed_at > now() - make_interval(secs => ${LIVE_WINDOW_SECONDS})) as live`);
  const live = rowsOf<{ live: number }>(result)[0]?.live ?? 0;
  return Math.max(0, live) / LIVE_WINDOW_SECONDS;
}

/** `share` of `live`, within [floor, ceiling]. */
export function pacedRate(share: number, live: number, floor: number, ceiling: number): number {
  return Math.min(ceiling, Math.max(floor, share * live));
}
