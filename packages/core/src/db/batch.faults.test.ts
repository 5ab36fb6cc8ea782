/**
 * Batches against the faults a second reader found (#23): a COMMIT hidden
 * from the batch's gate (an identifier the scanner misread, a string read
 * under the other `standard_conforming_strings`), a failure that only COMMIT
 * sees (a statement the last handler did not await; or the DELETE of an
 * earlier failed job's fence), a handler naming the batch's savepoint, a concurrent run whose
 * ROLLBACK waits out the budget behind a slow statement, a COMMIT whose
 * answer comes after the budget, a DO block that commits, and a copy of a
 * job in another worker's batch while this one runs again. Each test failed
 * on the code before its fix. postgres.js (patched) only: the connection
 * that pipelines, so the one where batches run concurrently; the sequential
 * mode's cases run there too.
 */
import { sql } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { deferredCheckOnEffects, jobs, outcomeAndAttempt, sleep, together } from "../../test/batches.ts";
import { useDriverMatrix } from "../../test/drivers.ts";
import { effects, silentLogger, testConsumers } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";
import type { Envelope } from "../envelope.ts";

const matrix = useDriverMatrix("batch-faults", { drivers: ["postgres.js"], isolations: ["read committed"] });
const consumer = testConsumers("batch_faults");
const BATCH = { maxSize: 8, maxWaitMs: 30, concurrent: true } as const;

describe.each(matrix)("batch faults on %s", (c) => {
  async function effectsOf(envelopes: readonly Envelope[]) {
    const [row] = await c.rows<{ effects: number; fences: number }>(
      `select (select count(*)::int from test_effects where job_id = any($1::uuid[])) as effects,
              (select count(*)::int from core.processed_jobs where job_id = any($1::uuid[])) as fences`,
      [envelopes.map((e) => e.job_id)],
    );
    return row;
  }

  // ---------------------------------------------------------------- gate bypass
  // transactionControlIn() must split a text "the way the server would". A
  // non-ASCII letter is an identifier character for Postgres, so in `é$x$`
  // the `$x$` is part of the identifier; the gate's scanner reads it as the
  // start of a dollar-quoted string and skips everything up to the next
  // `$x$` — including a COMMIT the server runs.
  for (const mode of ["concurrent", "sequential"] as const) {
    test(`[${mode}] a COMMIT hidden after an identifier like é$x$ is refused: a job whose handler failed is never acknowledged`, async () => {
      const definition = consumer(
        async (data, { tx, envelope }) => {
          if (data.n === 1) {
            await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: 1 });
            await tx.execute(sql.raw("select 1 as é$x$; commit; select 1 as é$x$"));
            return;
          }
          // Job 2 fails: it must be retried, its fence never committed.
          if (mode === "concurrent") await sleep(50);
          throw new Error("job 2 failed");
        },
        { batch: { ...BATCH, concurrent: mode === "concurrent" } },
      );
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(2);
      const results = await together(bound, batch);
      // Job 2's handler threw every time it ran; it is not done.
      expect(results[1]?.outcome).not.toBe("duplicate");
      expect(results[1]?.outcome).not.toBe("success");
      expect(await effectsOf([batch[1] as Envelope])).toMatchObject({ fences: 0 });
      // Redelivered, job 2 (whose handler never succeeded) must run again, not be a duplicate.
      const again = await bound.deliver({ body: JSON.stringify(batch[1]), deliveryCount: 2 });
      expect(again.outcome).not.toBe("duplicate");
    });
  }

  // A sequential batch keeps each job's savepoint (the next one nests inside
  // it): a handler that released the savepoint above its work and rolled
  // back to the one below would undo the previous job's work, whose fence
  // (written at the batch's opening) would still commit.
  test("[sequential] a handler that names the batch's own savepoint cannot undo the job before it: every committed fence has its effect", async () => {
    const definition = consumer(
      async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (data.n === 2) {
          await tx
            .execute(sql.raw("release savepoint softcrum_job; rollback to savepoint softcrum_job"))
            .catch(() => {});
        }
      },
      { batch: { ...BATCH, concurrent: false } },
    );
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(2);
    const results = await together(bound, batch);
    expect(results[0]?.outcome).toBe("success");
    expect(await effectsOf([batch[0] as Envelope])).toEqual({ effects: 1, fences: 1 });
    // Job 2 caught the error of its failed statement: retried, nothing of it committed.
    expect(results[1]?.outcome).toBe("retry");
    expect(await effectsOf([batch[1] as Envelope])).toEqual({ effects: 0, fences: 0 });
  });

  // With standard_conforming_strings off (a database/role default the
  // harness does not control), '\'' ends a string for the server, while the
  // scanner (standard strings only) reads '' as an escaped quote and keeps
  // going: the COMMIT after it is not seen.
  test("[concurrent] with standard_conforming_strings off, a COMMIT after 'a\\'' is refused: no other job's fence commits early", async () => {
    const definition = consumer(
      async (data, { tx }) => {
        if (data.n === 1) {
          await tx.execute(sql.raw(String.raw`select 'a\''; commit; select 1 --'`));
          return;
        }
        await sleep(50);
        throw new Error("job 2 failed");
      },
      { batch: BATCH },
    );
    const bound = bindConsumer(definition, {
      db: c.db(2, { standard_conforming_strings: "off", escape_string_warning: "off" }),
      logger: silentLogger,
    });
    const batch = jobs(2);
    const results = await together(bound, batch);
    expect(results[1]?.outcome).not.toBe("duplicate");
    expect(await effectsOf([batch[1] as Envelope])).toMatchObject({ fences: 0 });
  });

  // ------------------------------------------------------- unawaited failure
  // The last job of a batch sends a statement it does not await and returns:
  // the session still says the transaction is healthy, and only COMMIT sees
  // the failure (it answers ROLLBACK). Which job sent it is not known there:
  // no job is charged, every job is deferred and runs alone next time, where
  // the one that sent it is charged and the others commit.
  /** Job 4 sends a statement that fails after it returned, unawaited; with `firstFails`, job 1 throws too. */
  const lastLeavesAFailure = (mode: "concurrent" | "sequential", firstFails: boolean) =>
    consumer(
      async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (firstFails && data.n === 1) throw new Error("job 1 failed");
        if (data.n === 4) {
          void tx.execute(sql`select pg_sleep(0.2), 1 / floor(random())::int`).catch(() => {});
          await sleep(20); // sent, not answered
        }
      },
      { batch: { ...BATCH, concurrent: mode === "concurrent" } },
    );

  for (const mode of ["concurrent", "sequential"] as const)
    test(`[${mode}] the last job's statement it did not await fails after it returned: no other job is charged for it; alone, the one that sent it is`, async () => {
      const definition = lastLeavesAFailure(mode, false);
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(4);
      expect((await together(bound, batch)).map(outcomeAndAttempt)).toEqual(Array(4).fill(["deferred", false]));
      expect(await effectsOf(batch)).toMatchObject({ effects: 0, fences: 0 });
      const again = await together(bound, batch, 2);
      expect(again.map((r) => r.outcome)).toEqual(["success", "success", "success", "retry"]);
      expect(again[3]).toMatchObject({ spendsAttempt: true });
      expect(await effectsOf(batch)).toMatchObject({ effects: 3, fences: 3 });
    });

  // The same, with job 1 failing too: its fence row goes before COMMIT, and
  // that DELETE is the statement that meets the failure. The batch is undone
  // as at COMMIT, and each job runs alone next time (was: jobs 2 and 3
  // deferred round after round, job 4 never charged).
  for (const mode of ["concurrent", "sequential"] as const)
    test(`[${mode}] a statement the last job did not await fails, and an earlier job failed too: alone next time, the one that sent it is charged and the others commit`, async () => {
      const definition = lastLeavesAFailure(mode, true);
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(4);
      const first = await together(bound, batch);
      expect(first[0]).toMatchObject({ outcome: "retry", spendsAttempt: true });
      expect(first.slice(1).map(outcomeAndAttempt)).toEqual(Array(3).fill(["deferred", false]));
      expect(await effectsOf(batch)).toMatchObject({ effects: 0, fences: 0 });
      const again = await together(bound, batch, 2);
      expect(again.map((r) => r.outcome)).toEqual(["retry", "success", "success", "retry"]);
      expect(again[3]).toMatchObject({ spendsAttempt: true });
      expect(await effectsOf(batch)).toMatchObject({ effects: 2, fences: 2 });
    });

  // ---------------------------------------------------------- budget + suspects
  // After a concurrent run's first failure, ROLLBACK goes behind the
  // statements still in flight. When the budget runs out in that wait, the
  // batch aborts with no attempt spent, and the jobs that were still running
  // (job 2, whose statement outlives the budget) become suspects: their next
  // batch runs one handler after another, where each job is charged for its
  // own fault. Without that, both jobs would be deferred round after round.
  /** Job 1 fails at once; job 2's statement outlives the 1 s budget. */
  const failingAndSlow = () =>
    consumer(
      async (data, { tx }) => {
        if (data.n === 1) {
          await sleep(20);
          throw new Error("job 1 failed");
        }
        if (data.n === 2) await tx.execute(sql`select pg_sleep(1.4)`);
      },
      { batch: BATCH, timeoutMs: 1_000 },
    );

  test("[concurrent] a failing job and a too-slow job in one batch: redelivered, one of them is eventually charged", async () => {
    const definition = failingAndSlow();
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(2);
    const rounds: unknown[][] = [];
    for (let round = 1; round <= 3; round++) {
      rounds.push((await together(bound, batch, round)).map(outcomeAndAttempt));
      await sleep(600); // the zombie backend's pg_sleep ends, its locks go
    }
    expect(rounds.flat()).toContainEqual(["retry", true]);
  }, 20_000);

  test("the same two jobs alone are each charged (1: retry, 2: timeout retry)", async () => {
    const definition = failingAndSlow();
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const [one, two] = jobs(2) as [Envelope, Envelope];
    expect(outcomeAndAttempt(await bound.deliver({ body: JSON.stringify(one), deliveryCount: 1 }))).toEqual([
      "retry",
      true,
    ]);
    await sleep(100);
    expect(outcomeAndAttempt(await bound.deliver({ body: JSON.stringify(two), deliveryCount: 1 }))).toEqual([
      "retry",
      true,
    ]);
    await sleep(600);
  }, 20_000);

  // Once COMMIT went, a failure is every job's transient failure, as for a
  // single job (an attempt spent; the fence decides on retry), in both modes:
  // a COMMIT that always fails after the budget (a slow deferred check) ends
  // in the retry budget, not in deferrals without end.
  for (const mode of ["concurrent", "sequential"] as const)
    test(`[${mode}] a COMMIT that outlives the budget and fails is charged like a single job's (an attempt spent), not deferred forever`, async () => {
      const drop = await deferredCheckOnEffects(
        c,
        "batch_faults_slow_check",
        "if new.amount = 101 then perform pg_sleep(1.3); raise exception 'deferred check failed'; end if;",
      );
      try {
        const definition = consumer(
          async (data, { tx, envelope }) => {
            await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: 100 + data.n });
          },
          { batch: { ...BATCH, concurrent: mode === "concurrent" }, timeoutMs: 1_000 },
        );
        const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
        const batch = jobs(2);
        const rounds: unknown[][] = [];
        for (let round = 1; round <= 2; round++) {
          rounds.push((await together(bound, batch, round)).map(outcomeAndAttempt));
          await sleep(700);
        }
        expect(await effectsOf(batch)).toMatchObject({ fences: 0 });
        expect(rounds.flat()).toContainEqual(["retry", true]);
      } finally {
        await drop();
      }
    }, 20_000);
});

describe.each(matrix)("batch faults, other sessions, on %s", (c) => {
  async function countsOf(envelopes: readonly Envelope[]) {
    return c.rows<{ job_id: string; effects: number; fences: number }>(
      `select j::text as job_id,
              (select count(*)::int from test_effects where job_id = j) as effects,
              (select count(*)::int from core.processed_jobs where job_id = j) as fences
         from unnest($1::uuid[]) with ordinality as u(j, o) order by o`,
      [envelopes.map((e) => e.job_id)],
    );
  }

  // Fine: a DO block / procedure that commits fails inside a transaction block
  // ("invalid transaction termination"), so it is the handler's own failure.
  test("[concurrent] a DO block that commits fails its own job only; the other commits", async () => {
    const definition = consumer(
      async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (data.n === 1) await tx.execute(sql.raw("do $$ begin commit; end $$"));
      },
      { batch: BATCH },
    );
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(2);
    const results = await together(bound, batch);
    expect(results.map((r) => r.outcome)).toEqual(["retry", "success"]);
    expect((await countsOf(batch)).map((r) => [r.effects, r.fences])).toEqual([
      [0, 0],
      [1, 1],
    ]);
  });

  // A copy of job J runs in batch Y (another worker) while batch X, holding
  // J's fence, fails in its concurrent run and runs again sequentially.
  test("[concurrent] a copy of a job in another worker's batch, while this batch reruns: one effect per job, no deadlock", async () => {
    let failK = true;
    const definition = consumer(
      async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        if (data.n === 2 && failK) {
          await sleep(150);
          throw new Error("K failed");
        }
      },
      { batch: BATCH },
    );
    const w1 = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const w2 = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const [j, k, l] = jobs(3) as [Envelope, Envelope, Envelope];
    const x = together(w1, [j, k]);
    await sleep(60);
    const y = together(w2, [j, l]);
    const [rx, ry] = await Promise.all([x, y]);
    const outcomes = [...rx, ...ry].map((r) => r.outcome);
    expect(outcomes.filter((o) => o === "success")).toHaveLength(2); // J once, L
    expect(outcomes.filter((o) => o === "duplicate")).toHaveLength(1); // the other J
    expect(rx[1]?.outcome).toBe("retry");
    expect((await countsOf([j, k, l])).map((r) => [r.effects, r.fences])).toEqual([
      [1, 1],
      [0, 0],
      [1, 1],
    ]);
    failK = false;
  });
});

// ------------------------------------------------------------- shared budget
// A batch shares one budget of timeoutMs. A job that runs out of it after
// other jobs spent part of it (earlier in the batch), or behind a statement
// an earlier handler left running, may be late through no fault of its own:
// it spends no attempt, and every job of the batch runs alone next time,
// with a budget of its own, where a job that is slow itself is charged.
// Before: the job running when the budget went was charged, round after
// round (a batch whose jobs together outlast the budget never committed, and
// dead-lettered an innocent job); on node-postgres nobody was charged and
// nothing ever committed.
const budgetMatrix = useDriverMatrix("batch-budget", {
  drivers: ["postgres.js", "node-postgres", "PGlite"],
  isolations: ["read committed"],
});
const budgetConsumer = testConsumers("batch_budget");
const RETRY = { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 10 } as const;

/** Delivers `batch` round after round (delivery count = round) until every job is done or `rounds` are spent. */
async function untilDone(bound: ReturnType<typeof bindConsumer>, batch: readonly Envelope[], rounds: number) {
  const seen: { job: number; outcome: string; spendsAttempt: unknown }[] = [];
  let left = [...batch];
  for (let round = 1; round <= rounds && left.length > 0; round++) {
    const results = await together(bound, left, round);
    const next: Envelope[] = [];
    results.forEach((r, i) => {
      const e = left[i] as Envelope;
      seen.push({
        job: (e.data as { n: number }).n,
        outcome: r.outcome,
        spendsAttempt: (r as { spendsAttempt?: unknown }).spendsAttempt,
      });
      if (r.outcome !== "success" && r.outcome !== "dead_lettered") next.push(e);
    });
    left = next;
  }
  return seen;
}

describe.each(budgetMatrix)("a batch's shared budget on %s", (c) => {
  test("[sequential] jobs that each fit the budget but together outlast it: no attempt spent, each commits alone next time", async () => {
    const definition = budgetConsumer(
      async (data, { tx, envelope }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        await sleep(300);
      },
      { batch: { ...BATCH, concurrent: false }, timeoutMs: 1_000, retry: RETRY },
    );
    const bound = bindConsumer(definition, { db: c.db(4), logger: silentLogger });
    const batch = jobs(4);
    const seen = await untilDone(bound, batch, 4);
    // The batch: every job deferred, none charged (was: the one running when the budget went).
    expect(seen.slice(0, 4).map((s) => [s.outcome, s.spendsAttempt])).toEqual(Array(4).fill(["deferred", false]));
    // Alone, each within its own budget. (PGlite's one session runs the jobs
    // alone one after another, and the wait for it counts in the budget: a
    // job may be charged there once, as four single jobs would be.)
    if (c.server) expect(seen.filter((s) => s.spendsAttempt === true)).toEqual([]);
    expect(
      seen
        .filter((s) => s.outcome === "success")
        .map((s) => s.job)
        .sort(),
    ).toEqual([1, 2, 3, 4]);
    const [row] = await c.rows<{ n: number }>(
      "select count(*)::int as n from test_effects where job_id = any($1::uuid[])",
      [batch.map((e) => e.job_id)],
    );
    expect(row?.n).toBe(4);
  });

  if (c.server)
    test("[sequential] a statement one handler left running outlasts the budget: only that job is ever charged, the others commit", async () => {
      const definition = budgetConsumer(
        async (data, { tx, envelope }) => {
          await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
          if (data.n === 2) {
            void tx.execute(sql`select pg_sleep(1.5)`).catch(() => {});
            await sleep(20); // sent, not answered
          }
        },
        { batch: { ...BATCH, concurrent: false }, timeoutMs: 1_000, retry: RETRY },
      );
      const bound = bindConsumer(definition, { db: c.db(4), logger: silentLogger });
      const batch = jobs(4);
      const seen = await untilDone(bound, batch, 3);
      expect(seen.filter((s) => s.spendsAttempt === true && s.job !== 2)).toEqual([]);
      expect(
        seen
          .filter((s) => s.outcome === "success")
          .map((s) => s.job)
          .sort(),
      ).toEqual([1, 3, 4]);
      expect(seen.some((s) => s.job === 2 && s.spendsAttempt === true)).toBe(true);
    });
});
