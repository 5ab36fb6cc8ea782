/**
 * What runs inside COMMIT, after everything the engine sent before it: the
 * pending deferred triggers (an application table's own) and the queries of
 * WITH HOLD cursors. The engine fires the one and closes the other before its
 * durable setting, on every driver and isolation default, single and batched:
 * neither can turn synchronous_commit off for the COMMIT that carries the
 * fence, and no holdable cursor outlives the job on the pooled connection.
 * A deferred constraint the work breaks fails there too, before COMMIT: in a
 * batch, nothing committed and which job broke it is not known, so no job is
 * charged and each runs alone next time, where the one that broke it is.
 * (The crash itself: test/server-crash.test.ts.)
 */
import { sql } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { deferredCheckOnEffects, job, jobs, outcomeAndAttempt, together } from "../../test/batches.ts";
import { recordCommitModes } from "../../test/commit-modes.ts";
import { useDriverMatrix } from "../../test/drivers.ts";
import { effects, silentLogger, testConsumers } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";

const matrix = useDriverMatrix("commit-inside");
const consumer = testConsumers("inside");

describe.each(matrix)("on %s", (c) => {
  test.each([
    ["a single job", undefined],
    ["a batch", { maxSize: 4, maxWaitMs: 30 }],
  ])(
    "%s: an application table's deferred trigger that turns synchronous_commit off runs before the durable setting, so COMMIT runs with the session's own",
    async (_, batch) => {
      await c.rows(`create table if not exists inside_audit (job_id uuid)`);
      await c.rows(`create or replace function inside_audit_async() returns trigger language plpgsql as $$
      begin perform pg_catalog.set_config('synchronous_commit', 'off', true); return null; end $$`);
      await c.rows(`drop trigger if exists inside_audit_async on inside_audit`);
      await c.rows(`create constraint trigger inside_audit_async after insert on inside_audit
      deferrable initially deferred for each row execute function inside_audit_async()`);
      const definition = consumer(
        async (data, { tx, envelope }) => {
          await tx.execute(sql`insert into inside_audit (job_id) values (${envelope.job_id})`);
          await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        },
        batch ? { batch } : {},
      );
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const recorder = await recordCommitModes(c);
      try {
        const burst = jobs(3, 1);
        expect((await together(bound, burst)).map((r) => r.outcome)).toEqual(Array(3).fill("success"));
        // The cases' sessions run with the server's default, on.
        expect(await recorder.modes()).toEqual(Array(3).fill(["test_effects", "on"]));
      } finally {
        await recorder.drop();
      }
    },
  );

  test("a handler's WITH HOLD cursor is closed before COMMIT: it does not outlive the job on the pooled connection", async () => {
    const definition = consumer(async (data, { tx, envelope }) => {
      await tx.execute(sql.raw(`declare inside_hold cursor with hold for select ${data.n} as n`));
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
    });
    const db = c.db(1);
    const bound = bindConsumer(definition, { db, logger: silentLogger });
    for (const e of [job(1), job(2)]) {
      expect((await bound.deliver({ body: JSON.stringify(e), deliveryCount: 1 })).outcome).toBe("success");
    }
    // The pool's one connection, the one both jobs ran on.
    const cursors = await db.execute(sql`select name from pg_cursors where is_holdable`);
    expect(Array.isArray(cursors) ? cursors : (cursors as { rows: unknown[] }).rows).toEqual([]);
  });

  for (const concurrent of [false, true])
    test(`a batch (${concurrent ? "concurrent" : "sequential"}) in which one job breaks a deferred constraint: no other job is charged for it; alone next time, in any process, the one that broke it is`, async () => {
      const drop = await deferredCheckOnEffects(
        c,
        "inside_deferred_check",
        "if new.amount = 702 then raise exception 'amount 702 refused at commit' using errcode = '23514'; end if;",
      );
      try {
        const definition = consumer(
          async (data, { tx, envelope }) => {
            await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: 700 + data.n });
          },
          { batch: { maxSize: 4, maxWaitMs: 30, concurrent } },
        );
        const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
        const burst = jobs(4);
        const alone = [
          ["success", undefined],
          ["retry", true],
          ["success", undefined],
          ["success", undefined],
        ];
        const first = await together(bound, burst);
        if (c.driver === "postgres.js unpatched") {
          // One job per transaction on this driver (batch.contract.test.ts): alone from the start.
          expect(first.map(outcomeAndAttempt)).toEqual(alone);
        } else {
          expect(first.map(outcomeAndAttempt)).toEqual(Array(4).fill(["deferred", false]));
          // Redelivered to another process (its own runner, which never saw
          // the batch): the transport's count of deferrals says each runs alone.
          const other = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
          const again = await Promise.all(
            burst.map((e) => other.deliver({ body: JSON.stringify(e), deliveryCount: 1, deferrals: 1 })),
          );
          expect(again.map(outcomeAndAttempt)).toEqual(alone);
        }
        const [row] = await c.rows<{ effects: number; fences: number }>(
          `select (select count(*)::int from test_effects where job_id = any($1::uuid[])) as effects,
                  (select count(*)::int from core.processed_jobs where job_id = any($1::uuid[])) as fences`,
          [burst.map((e) => e.job_id)],
        );
        expect(row).toEqual({ effects: 3, fences: 3 });
      } finally {
        await drop();
      }
    });
});
