/**
 * `raw_postgresjs` (a reference, run only when PEERS_SYSTEMS names it): the
 * single-job transaction of `harness` written by hand on postgres.js, with
 * no job system and none of the harness's checks — the ceiling of a Node.js
 * client that commits once per job. Same loops, pool, envelopes and fence
 * table (`core.processed_jobs`, core's migrations applied) as `harness`; per
 * job: JSON.parse of the body, a reserved connection, BEGIN pipelined with
 * the fence insert `ON CONFLICT DO NOTHING`, the effect insert when the fence
 * row is new, COMMIT — three round trips, as the harness's single job. No
 * schema check, no bounds, no ordering lock, no pending-letter look-up, no
 * commit proof, no retry or dead letter: what the harness adds is the gap
 * between this and `harness`.
 */
import { migrateCore } from "@softcrum/core/migrate";
import postgres from "postgres";
import type { RunSpec, Sample } from "./config.ts";
import { measured, POOL_MAX } from "./harness.ts";
import { withFreshDatabases } from "./measure.ts";

const CONSUMER = "peers.raw";

interface Body {
  readonly job_id: string;
  readonly data: { readonly amount: number };
}

export function runRawPostgresJs(spec: RunSpec): Promise<Sample> {
  return withFreshDatabases(spec, [{ label: spec.system, effects: true }], async ([database]) => {
    if (!database) throw new Error("no database");
    await migrateCore(database.url);
    const sql = postgres(database.url, { max: POOL_MAX, onnotice: () => {} });
    const job = async (body: string) => {
      const { job_id: jobId, data } = JSON.parse(body) as Body;
      const conn = await sql.reserve();
      try {
        // Sent together: postgres.js pipelines them on the reserved connection.
        const begin = conn`begin`.execute();
        const fence = conn`insert into core.processed_jobs (job_id, consumer, processed_at)
          values (${jobId}, ${CONSUMER}, clock_timestamp()) on conflict do nothing returning 1`.execute();
        await begin;
        if ((await fence).length > 0)
          await conn`insert into effects (job_id, amount) values (${jobId}, ${data.amount})`;
        await conn`commit`;
      } catch (error) {
        await conn`rollback`.catch(() => {});
        throw error;
      } finally {
        conn.release();
      }
    };
    try {
      return await measured(spec, database.url, job);
    } finally {
      await sql.end({ timeout: 5 });
    }
  });
}
