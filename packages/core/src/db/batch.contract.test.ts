/**
 * Batched work transactions (#23 item 1) hold every rule of SPEC §4 per job,
 * on every driver and at every database default isolation level: jobs that
 * arrive together commit in one transaction, and each one's outcome is the
 * one it would have had alone.
 */
import { sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { describe, expect, test } from "vitest";
import { deferredCheckOnEffects, jobs, outcomeAndAttempt, sleep, together } from "../../test/batches.ts";
import { recordCommitModes } from "../../test/commit-modes.ts";
import { type DriverCase, someoneWaitsOnALock, useDriverMatrix } from "../../test/drivers.ts";
import { effects, silentLogger, testConsumers, type testJobSchema } from "../../test/fixtures.ts";
import { heldLetterDecision } from "../../test/held-decision.ts";
import { latch } from "../../test/latch.ts";
import { bindConsumer, type ConsumerDefinition } from "../consumer.ts";
import type { Envelope } from "../envelope.ts";
import { PermanentError, RateLimitedError } from "../errors.ts";
import type { BoundConsumer, DeliveryResult } from "../queue-port.ts";

// postgres.js without the #1208 patch has its own cases below.
// Read committed and serializable: the engine pins its own level, and the
// single-job contract covers repeatable read on every driver.
const matrix = useDriverMatrix("batch-contract", {
  drivers: ["postgres.js", "node-postgres", "PGlite"],
  isolations: ["read committed", "serializable"],
});
const unpatched = useDriverMatrix("batch-contract-unpatched", {
  drivers: ["postgres.js unpatched"],
  isolations: ["read committed"],
});
const consumer = testConsumers("batch");
const BATCH = { maxSize: 8, maxWaitMs: 30 } as const;
/**
 * Every case runs with the handlers of a batch one after another (a savepoint
 * each) and with `concurrent` handlers (pipelined, no savepoints, the batch
 * run again the sequential way after any failure). Where the connection does
 * not pipeline (node-postgres, PGlite), `concurrent` runs them one after
 * another: the same outcomes.
 */
const MODES = ["sequential", "concurrent"] as const;
type Mode = (typeof MODES)[number];

type Handler = ConsumerDefinition<typeof testJobSchema>["handle"];
type Then = (n: number, tx: Parameters<Handler>[1]["tx"]) => Promise<void>;
/** A batched consumer whose handler writes one effect per run, then does `then` (by job number). */
function batchedAs(mode: Mode) {
  return (then: Then = async () => {}, extra = {}) => {
    const runs: number[] = [];
    const definition = consumer(
      async (data, { tx, envelope }) => {
        runs.push(data.n);
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
        await then(data.n, tx);
      },
      { batch: { ...BATCH, concurrent: mode === "concurrent" }, ...extra },
    );
    return { definition, runs };
  };
}

type BatchedDefinition = ReturnType<ReturnType<typeof batchedAs>>["definition"];

async function stateOf(c: DriverCase, envelopes: readonly Envelope[]) {
  const ids = envelopes.map((e) => e.job_id);
  const [row] = await c.rows<{ effects: number; fences: number; letters: number; transactions: number }>(
    `select (select count(*)::int from test_effects where job_id = any($1::uuid[])) as effects,
            (select count(*)::int from core.processed_jobs where job_id = any($1::uuid[])) as fences,
            (select count(*)::int from core.dead_letters where job_id = any($1::text[]) and status = 'pending_review') as letters,
            (select count(distinct xmin::text)::int from core.processed_jobs where job_id = any($1::uuid[])) as transactions`,
    [ids],
  );
  return row;
}

const cases = MODES.flatMap((mode) => matrix.map((c) => [mode, c] as const));
describe.each(cases)("%s handlers on %s", (mode, c) => {
  /** `job` dead-lettered (permanent) by a delivery of its own, before the test's batch. */
  async function deadLetterFirst(definition: BatchedDefinition, job: Envelope): Promise<void> {
    const failing = bindConsumer(
      { ...definition, handle: async () => Promise.reject(new PermanentError("closed")) },
      { db: c.db(1), logger: silentLogger },
    );
    expect(await failing.deliver({ body: JSON.stringify(job), deliveryCount: 1 })).toMatchObject({
      outcome: "dead_lettered",
    });
  }
  const batched = batchedAs(mode);
  /** The concurrent run pipelines here: after a failure it is rolled back and every handler runs again. */
  const reruns = mode === "concurrent" && c.driver === "postgres.js";

  test("8 jobs delivered together commit in one transaction; delivered again together, all 8 are duplicates that run nothing", async () => {
    const { definition, runs } = batched();
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    expect((await together(bound, batch)).map((r) => r.outcome)).toEqual(Array(8).fill("success"));
    expect(await stateOf(c, batch)).toEqual({ effects: 8, fences: 8, letters: 0, transactions: 1 });
    expect((await together(bound, batch, 2)).map((r) => r.outcome)).toEqual(Array(8).fill("duplicate"));
    expect(runs).toHaveLength(8);
  });

  test("a handler that sets synchronous_commit off for its transaction does not make the batch's COMMIT skip the WAL flush: every effect commits with the session's own (on)", async () => {
    const { definition } = batched(async (n, tx) => {
      if (n === 3) await tx.execute(sql`set local synchronous_commit = off`);
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const recorder = await recordCommitModes(c);
    try {
      const batch = jobs(4);
      expect((await together(bound, batch)).map((r) => r.outcome)).toEqual(Array(4).fill("success"));
      expect(await stateOf(c, batch)).toMatchObject({ effects: 4, transactions: 1 });
      expect(await recorder.modes()).toEqual(Array(4).fill(["test_effects", "on"]));
    } finally {
      await recorder.drop();
    }
  });

  test("a copy of a job in the same burst never shares its batch: one success, one duplicate, one effect", async () => {
    const { definition, runs } = batched();
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(6);
    const copied = batch[2] as Envelope;
    const outcomes = (await together(bound, [...batch, copied])).map((r) => r.outcome);
    expect(outcomes.filter((o) => o === "success")).toHaveLength(6);
    expect(outcomes.filter((o) => o === "duplicate")).toHaveLength(1);
    expect(runs.filter((n) => n === 3)).toHaveLength(1);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 6, fences: 6 });
  });

  test("a handler that throws is undone alone: its effect and fence are gone, the other 7 commit, and its retry applies it once", async () => {
    let fail = true;
    const { definition, runs } = batched(async (n) => {
      if (n === 4 && fail) throw new Error("partner down");
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    const results = await together(bound, batch);
    // Concurrent: the first run of all 8 is undone, and they run again one after another.
    expect(runs).toHaveLength(reruns ? 16 : 8);
    expect(results[3]).toMatchObject({ outcome: "retry", spendsAttempt: true });
    expect(String((results[3] as { error?: unknown }).error)).toContain("partner down");
    expect(results.filter((r) => r.outcome === "success")).toHaveLength(7);
    expect(await stateOf(c, [batch[3] as Envelope])).toMatchObject({ effects: 0, fences: 0 });
    expect(await stateOf(c, batch)).toMatchObject({ effects: 7, fences: 7, transactions: 1 });
    fail = false;
    expect((await together(bound, batch, 2)).map((r) => r.outcome)).toEqual([
      ...Array(3).fill("duplicate"),
      "success",
      ...Array(4).fill("duplicate"),
    ]);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 8, fences: 8, letters: 0 });
  });

  test("a PermanentError dead-letters its job alone and a rate limit defers its job alone (no attempt spent); the others commit", async () => {
    const { definition } = batched(async (n) => {
      if (n === 2) throw new PermanentError("account closed");
      if (n === 5) throw new RateLimitedError("slow down", { retryAfterMs: 2_000 });
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    const results = await together(bound, batch);
    expect(results[1]).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    expect(results[4]).toMatchObject({ outcome: "rate_limited", spendsAttempt: false });
    expect(results.filter((r) => r.outcome === "success")).toHaveLength(6);
    expect(await stateOf(c, [batch[1] as Envelope])).toEqual({ effects: 0, fences: 0, letters: 1, transactions: 0 });
    expect(await stateOf(c, [batch[4] as Envelope])).toMatchObject({ effects: 0, fences: 0, letters: 0 });
    expect(await stateOf(c, batch)).toMatchObject({ effects: 6, fences: 6 });
  });

  test("a handler that catches the error of a failed statement is undone alone and retried; the others commit", async () => {
    const { definition } = batched(async (n, tx) => {
      if (n === 6) await tx.execute(sql`select 1/0`).catch(() => {});
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    const results = await together(bound, batch);
    expect(results[5]).toMatchObject({ outcome: "retry", spendsAttempt: true });
    expect(results.filter((r) => r.outcome === "success")).toHaveLength(7);
    expect(await stateOf(c, [batch[5] as Envelope])).toMatchObject({ effects: 0, fences: 0 });
    expect(await stateOf(c, batch)).toMatchObject({ effects: 7, fences: 7, transactions: 1 });
  });

  test.each([
    ["commit", sql`commit`],
    ["a commit behind a comment", sql.raw("/* done */ COMMIT")],
    ["rollback", sql`rollback`],
    ["end", sql`end`],
  ])(
    "a handler that sends %s through tx is refused: no job of the batch is marked done without its work",
    async (_, statement) => {
      const { definition, runs } = batched(async (n, tx) => {
        if (n === 3) await tx.execute(statement);
      });
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(8);
      const results = await together(bound, batch);
      expect(results[2]).toMatchObject({ outcome: "retry" });
      expect(String((results[2] as { error?: string }).error)).toMatch(/refused/);
      expect(results.filter((r) => r.outcome === "success")).toHaveLength(7);
      // Every fence that exists has its effect: none was committed early by the handler.
      const [orphans] = await c.rows<{ n: number }>(
        `select count(*)::int as n from core.processed_jobs p where consumer = $1
         and not exists (select 1 from test_effects e where e.job_id = p.job_id)`,
        [definition.name],
      );
      expect(orphans?.n).toBe(0);
      expect(await stateOf(c, batch)).toMatchObject({ effects: 7, fences: 7 });
      // Concurrent: the refusal sends the batch back to run one handler after another.
      expect(runs).toHaveLength(reruns ? 16 : 8);
    },
  );

  test("a nested tx.transaction() in a batched handler is a savepoint of its own: its failure rolls back only its writes", async () => {
    const { definition } = batched(async (n, tx) => {
      if (n !== 2) return;
      await tx
        .transaction(async (inner) => {
          await inner
            .insert(effects)
            .values({ jobId: "00000000-0000-7000-8000-000000000000", consumer: "x", amount: 0 });
          throw new Error("inner");
        })
        .catch(() => {});
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(4);
    expect((await together(bound, batch)).map((r) => r.outcome)).toEqual(Array(4).fill("success"));
    expect(await stateOf(c, batch)).toMatchObject({ effects: 4, fences: 4, transactions: 1 });
    const [inner] = await c.rows<{ n: number }>("select count(*)::int as n from test_effects where consumer = 'x'");
    expect(inner?.n).toBe(0);
  });

  test("8 handlers of a batch: at once where concurrent and the connection pipelines, else one at a time; each runs once, one transaction", async () => {
    let running = 0;
    let most = 0;
    const { definition, runs } = batched(async () => {
      running += 1;
      most = Math.max(most, running);
      await sleep(20);
      running -= 1;
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    expect((await together(bound, batch)).map((r) => r.outcome)).toEqual(Array(8).fill("success"));
    expect(most).toBe(reruns ? 8 : 1);
    expect(runs).toHaveLength(8);
    expect(await stateOf(c, batch)).toEqual({ effects: 8, fences: 8, letters: 0, transactions: 1 });
  });

  test("a statement a handler did not await fails after it returned (COMMIT answers ROLLBACK): no job is a success without its effect, and redelivered alone the one that sent it is charged", async () => {
    const { definition } = batched(async (n, tx) => {
      // Fails when it runs (not when it is planned), after the handler returned.
      if (n === 1) void tx.execute(sql`select pg_sleep(0.2), 1 / floor(random())::int`).catch(() => {});
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    const results = await together(bound, batch);
    expect(results[0]?.outcome).not.toBe("success");
    if (c.driver === "postgres.js") {
      // The next job's savepoint fails behind it: the batch is undone through
      // no failure of its own (concurrent: COMMIT answered ROLLBACK, and the
      // batch ran again one handler after another, to the same end).
      expect(results.map(outcomeAndAttempt)).toEqual(Array(8).fill(["deferred", false]));
      // Redelivered, each job runs in a transaction of its own: the one that
      // sent the statement is charged, the others commit.
      const again = await together(bound, batch, 2);
      expect(again.map((r) => r.outcome)).toEqual(["retry", ...Array(7).fill("success")]);
      expect(again[0]).toMatchObject({ spendsAttempt: true });
      expect(await stateOf(c, batch)).toMatchObject({ effects: 7, fences: 7 });
      return;
    }
    const succeeded = batch.filter((_, i) => results[i]?.outcome === "success");
    expect(await stateOf(c, succeeded)).toMatchObject({ effects: succeeded.length, fences: succeeded.length });
    expect(await stateOf(c, batch)).toMatchObject({ effects: succeeded.length, fences: succeeded.length });
  });

  test("a handler that throws at once does not make the others wait on a slow one: the run again gets the rest of the budget", async () => {
    const { definition } = batched(
      async (n) => {
        if (n === 1) throw new Error("partner down");
        if (n === 2) await sleep(600); // deaf to its signal
      },
      { timeoutMs: 1_000 },
    );
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(4);
    const results = await together(bound, batch);
    expect(results[0]).toMatchObject({ outcome: "retry", spendsAttempt: true });
    expect(results.slice(1).map((r) => r.outcome)).toEqual(Array(3).fill("success"));
    expect(await stateOf(c, batch)).toMatchObject({ effects: 3, fences: 3, transactions: 1 });
  });

  test("two handlers' nested tx.transaction()s at once: one's rollback never undoes the other's savepoint work", async () => {
    const nested = (n: number) => `00000000-0000-7000-8000-00000000000${n}`;
    const { definition } = batched(async (n, tx) => {
      if (n > 2) return;
      await tx
        .transaction(async (inner) => {
          await inner.insert(effects).values({ jobId: nested(n), consumer: "nested", amount: n });
          // Job 1 fails its savepoint after job 2 has written in its own and released it.
          if (n === 1) {
            await sleep(40);
            throw new Error("inner");
          }
        })
        .catch(() => {});
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(4);
    expect((await together(bound, batch)).map((r) => r.outcome)).toEqual(Array(4).fill("success"));
    const rows = await c.rows<{ amount: number }>(
      "select amount from test_effects where consumer = 'nested' order by amount",
    );
    expect(rows.map((r) => r.amount)).toEqual([2]);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 4, fences: 4, transactions: 1 });
  });

  test("a job with a pending dead letter in a batch does not run and leaves no fence; the others commit", async () => {
    const { definition, runs } = batched();
    const batch = jobs(8);
    const lettered = batch[4] as Envelope;
    await deadLetterFirst(definition, lettered);
    const results = await together(bindConsumer(definition, { db: c.db(2), logger: silentLogger }), batch, 2);
    expect(results[4]).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    expect(results.filter((r) => r.outcome === "success")).toHaveLength(7);
    expect(runs).not.toContain(5);
    expect(await stateOf(c, [lettered])).toEqual({ effects: 0, fences: 0, letters: 1, transactions: 0 });
  });

  test("a session whose session_replication_role is replica (no trigger keeps the pending letters' keys): no batch runs — every job deferred, no attempt spent, nothing written", async () => {
    const { definition, runs } = batched();
    const batch = jobs(4);
    const replica = bindConsumer(definition, {
      db: c.db(1, { session_replication_role: "replica" }),
      logger: silentLogger,
    });
    const results = await together(replica, batch);
    expect(results.map(outcomeAndAttempt)).toEqual(Array(4).fill(["deferred", false]));
    expect(results[0]).toMatchObject({ error: expect.stringMatching(/session_replication_role is replica/) });
    expect(runs).toEqual([]);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 0, fences: 0, letters: 0 });
  });

  const charged = (r: DeliveryResult | undefined) =>
    r !== undefined && "spendsAttempt" in r && r.spendsAttempt === true;

  test("a handler past the batch's one budget: in the batch no job is charged (nothing commits), each runs alone next time, where the slow one alone is retried; redelivered, each applies once", async () => {
    let hang = true;
    const { definition } = batched(
      async (n) => {
        if (n === 3 && hang) await sleep(800);
      },
      { timeoutMs: 300 },
    );
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(6);
    // In the batch, job 3 runs out a budget others spent part of (sequential:
    // jobs 1 and 2 ran first; concurrent: the handlers' queries queue behind
    // each other, and which one made the batch late is not known): every job
    // is deferred without an attempt, and nothing commits. (Concurrent: the
    // next batch of the job still running then runs one handler after
    // another, which is the sequential case.)
    let round = 1;
    let results = await together(bound, batch, round);
    while (!charged(results[2]) && round < 3) {
      expect(results.map(outcomeAndAttempt)).toEqual(Array(6).fill(["deferred", false]));
      expect(await stateOf(c, batch)).toMatchObject({ effects: 0, fences: 0 });
      round += 1;
      results = await together(bound, batch, round);
    }
    // Alone, with a budget of its own, job 3 is the one charged; no other job ever is.
    expect(results[2]).toMatchObject({ outcome: "retry", spendsAttempt: true });
    expect(results.filter((r, i) => i !== 2 && charged(r))).toEqual([]);
    hang = false;
    await sleep(600); // the hung handler's late writes are refused, not run
    let left = batch.filter((_, i) => results[i]?.outcome !== "success");
    for (let again = round + 1; left.length > 0 && again <= round + 3; again++) {
      const next = await together(bound, left, again);
      expect(next.filter(charged)).toEqual([]);
      left = left.filter((_, i) => next[i]?.outcome !== "success");
    }
    expect(left).toEqual([]);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 6, fences: 6 });
  });

  if (c.server) {
    test("jobs of one ordering key never share a batch nor run at once; batches with the same keys in opposite orders never deadlock", async () => {
      const running = new Map<string, number>();
      let overlaps = 0;
      const { definition } = batched(
        async (n) => {
          const key = `k${n % 2}`;
          if (running.get(key)) overlaps += 1;
          running.set(key, 1);
          await sleep(15);
          running.set(key, 0);
        },
        { orderingKey: (data: { n: number }) => `k${data.n % 2}` },
      );
      const bound = bindConsumer(definition, { db: c.db(4), logger: silentLogger });
      // Delivered 1,2 | 4,3 | 5,6 | 8,7 …: each batch holds one job of each key, every other one in the opposite order.
      const batch = jobs(16);
      const reordered = batch.flatMap((_, i) =>
        i % 2 === 1 ? [] : (i / 2) % 2 === 0 ? [batch[i], batch[i + 1]] : [batch[i + 1], batch[i]],
      );
      const results = await together(bound, reordered as Envelope[]);
      expect(results.map((r) => r.outcome)).toEqual(Array(16).fill("success"));
      expect(overlaps).toBe(0);
      expect(await stateOf(c, batch)).toMatchObject({ effects: 16, fences: 16 });
    });

    test("a batch whose fence insert waits on a dead-letter decision in flight for one of its jobs sees the letter it commits: that job never runs and leaves no fence, the others commit", async () => {
      const { definition, runs } = batched();
      const batch = jobs(4);
      const lettered = batch[2] as Envelope;
      const { decision, release } = await heldLetterDecision(c.db(1), lettered, definition);
      const delivered = together(bindConsumer(definition, { db: c.db(1), logger: silentLogger }), batch);
      await someoneWaitsOnALock(c);
      release();
      expect(await decision).toMatchObject({ status: "written" });
      const results = await delivered;
      expect(results.map((r) => r.outcome)).toEqual(["success", "success", "dead_lettered", "success"]);
      expect(results[2]).toMatchObject({ errorClass: "exhausted" });
      expect(runs).not.toContain(3);
      expect(await stateOf(c, [lettered])).toEqual({ effects: 0, fences: 0, letters: 1, transactions: 0 });
      expect(await stateOf(c, batch)).toMatchObject({ effects: 3, fences: 3, transactions: 1 });
    });

    test("a batch whose letter check meets a replay of one of its jobs' letters still committing waits for it and runs that job (the letter is no longer pending); the others commit", async () => {
      const { definition, runs } = batched();
      const batch = jobs(4);
      const lettered = batch[1] as Envelope;
      await deadLetterFirst(definition, lettered);
      // A replay in flight: the letter leaves pending_review (its key goes), not committed yet.
      const holder = c.db(1);
      const held = latch();
      const changed = latch();
      const replaying = holder.transaction(async (tx) => {
        await tx.execute(
          sql`update core.dead_letters set status = 'replayed', status_changed_at = now(), status_changed_by = 'test'
              where job_id = ${lettered.job_id}`,
        );
        changed.open();
        await held.opened;
      });
      await changed.opened;
      try {
        const delivered = together(bindConsumer(definition, { db: c.db(2), logger: silentLogger }), batch);
        await someoneWaitsOnALock(c);
        held.open();
        await replaying;
        const results = await delivered;
        expect(results.map((r) => r.outcome)).toEqual(Array(4).fill("success"));
      } finally {
        held.open();
        await replaying.catch(() => {});
      }
      expect(runs.filter((n) => n === 2)).toHaveLength(1);
      expect(await stateOf(c, batch)).toMatchObject({ effects: 4, fences: 4, letters: 0, transactions: 1 });
    });

    // A job found with a pending letter never runs; the batch must not keep
    // that letter's key locked while its other handlers run.
    const withLetters = {
      "a duplicate with a pending poison letter beside its fence (as versions before d942aab wrote one, without the fence key)":
        {
          async letter(bound: BoundConsumer, definition: BatchedDefinition, job: Envelope) {
            expect(await bound.deliver({ body: JSON.stringify(job), deliveryCount: 1 })).toMatchObject({
              outcome: "success",
            });
            // A copy of the done job whose payload failed the schema, lettered
            // by an earlier version (now a duplicate): such letters stay in
            // upgraded databases.
            const poison = JSON.stringify({ ...job, data: { n: "not a number" } });
            await c.rows(
              `insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
             values ($1, $2, $3, $4, $5, 0, 'data: expected number', 'poison')`,
              [uuidv7(), job.job_id, definition.queue, definition.name, poison],
            );
          },
          outcome: "duplicate",
          effects: 2,
        },
      "a fresh copy of a dead-lettered job (the letter under the fence key)": {
        async letter(_bound: BoundConsumer, definition: BatchedDefinition, job: Envelope) {
          await deadLetterFirst(definition, job);
        },
        outcome: "dead_lettered",
        effects: 1,
      },
    };
    test.each(Object.entries(withLetters))(
      "%s, in a batch: the batch does not hold that letter's key while its other handlers run, so a discard never waits on it",
      async (_, { letter, outcome, effects }) => {
        const held = latch();
        const inHandler = latch();
        const { definition } = batched(async (n) => {
          if (n !== 2) return;
          inHandler.open();
          await held.opened;
        });
        const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
        const [lettered, fresh] = jobs(2) as [Envelope, Envelope];
        await letter(bound, definition, lettered);
        const key = "select dead_letter_id from core.pending_letter_keys where job_id = $1 and consumer = $2";
        expect(await c.rows(key, [lettered.job_id, definition.name])).toHaveLength(1);
        const delivered = together(bound, [lettered, fresh], 2);
        try {
          await inHandler.opened; // the batch is open: its fences are inserted and its letters read
          // What a discard of that letter takes first; a lock the batch held until COMMIT would refuse it.
          expect(await c.rows(`${key} for update nowait`, [lettered.job_id, definition.name])).toHaveLength(1);
        } finally {
          held.open();
        }
        const results = await delivered;
        expect(results.map((r) => r.outcome)).toEqual([outcome, "success"]);
        expect(await stateOf(c, [lettered, fresh])).toMatchObject({ effects, fences: effects, letters: 1 });
      },
    );

    test("a batch whose opening waits out most of the budget on another job's ordering key held elsewhere: the first job, late through no fault of its own, is not charged; alone, each commits", async () => {
      const { definition } = batched(
        async () => {
          await sleep(300);
        },
        { timeoutMs: 1_000, orderingKey: (data: { n: number }) => `k${data.n}` },
      );
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(2);
      // Another session holds job 2's key (as another batch of that key would) for 850 ms.
      const holder = c.db(1);
      const held = latch();
      const locked = latch();
      const holding = holder.transaction(async (tx) => {
        await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${`${definition.name}|k2`}, 0))`);
        locked.open();
        await held.opened;
      });
      await locked.opened;
      const release = setTimeout(held.open, 850);
      try {
        const results = await together(bound, batch);
        expect(results.map(outcomeAndAttempt)).toEqual([
          ["deferred", false],
          ["deferred", false],
        ]);
      } finally {
        clearTimeout(release);
        held.open();
        await holding;
      }
      expect(await stateOf(c, batch)).toMatchObject({ effects: 0, fences: 0 });
      const again = await together(bound, batch, 2);
      expect(again.map((r) => r.outcome)).toEqual(["success", "success"]);
      expect(await stateOf(c, batch)).toMatchObject({ effects: 2, fences: 2 });
    });

    if (c.driver === "node-postgres") {
      // Here the commit check (SET CONSTRAINTS, then the transaction id) goes
      // before COMMIT, in statements of its own; postgres.js sends it in
      // COMMIT's message, where a late answer may have committed.
      test("a commit check with no answer within the budget (one job's deferred trigger is slow): COMMIT never went, so no job is charged; alone, the slow one is", async () => {
        const drop = await deferredCheckOnEffects(
          c,
          "batch_slow_commit_check",
          "if new.amount = 902 then perform pg_sleep(1.2); end if;",
        );
        const sleepersGone = async () => {
          for (let i = 0; i < 200; i++) {
            const [row] = await c.rows<{ n: number }>(
              "select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event = 'PgSleep'",
            );
            if (row?.n === 0) return;
            await sleep(25);
          }
        };
        try {
          const slow = consumer(
            async (data, { tx, envelope }) => {
              await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: 900 + data.n });
            },
            { batch: { ...BATCH, concurrent: mode === "concurrent" }, timeoutMs: 700 },
          );
          const bound = bindConsumer(slow, { db: c.db(2), logger: silentLogger });
          const batch = jobs(2);
          const results = await together(bound, batch);
          expect(results.map(outcomeAndAttempt)).toEqual([
            ["deferred", false],
            ["deferred", false],
          ]);
          await sleepersGone(); // the cut-off session ends once its trigger returns
          expect(await stateOf(c, batch)).toMatchObject({ effects: 0, fences: 0 });
          const again = await together(bound, batch, 2);
          expect(again.map(outcomeAndAttempt)).toEqual([
            ["success", undefined],
            ["retry", true],
          ]);
          await sleepersGone();
          expect(await stateOf(c, batch)).toMatchObject({ effects: 1, fences: 1 });
        } finally {
          await drop();
        }
      });
    }

    test("a backend terminated mid-batch: no job is a success, nothing lands, and redelivered each applies once", async () => {
      let kill = true;
      const { definition } = batched(async (n, tx) => {
        if (n !== 4 || !kill) return;
        kill = false;
        const result = await tx.execute(sql`select pg_backend_pid() as pid`);
        const rows = (Array.isArray(result) ? result : (result as { rows: unknown[] }).rows) as { pid: number }[];
        const pid = rows[0]?.pid;
        await c.rows("select pg_terminate_backend($1)", [pid]);
        await sleep(50);
      });
      const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
      const batch = jobs(8);
      const results = await together(bound, batch);
      expect(results.filter((r) => r.outcome === "success")).toHaveLength(0);
      expect(await stateOf(c, batch)).toMatchObject({ effects: 0, fences: 0 });
      const again = await together(bound, batch, 2);
      expect(again.map((r) => r.outcome)).toEqual(Array(8).fill("success"));
      expect(await stateOf(c, batch)).toMatchObject({ effects: 8, fences: 8 });
    });

    test("two batches whose handlers deadlock each other: the job the server picks is undone alone and retried; every job ends with one effect", async () => {
      await c.rows("create table if not exists batch_rows (id int primary key, v int not null default 0)");
      await c.rows("insert into batch_rows (id) values (1), (2) on conflict do nothing");
      const { definition } = batched(async (n, tx) => {
        // Batch one: job 1 takes row 1, then job 2 row 2; batch two: job 3 takes row 2, then job 4 row 1.
        const row = n === 1 || n === 4 ? 1 : 2;
        await tx.execute(sql`update batch_rows set v = v + 1 where id = ${row}`);
        if (n === 1 || n === 3) await sleep(150);
      });
      const bound = bindConsumer(definition, { db: c.db(4), logger: silentLogger });
      const [j1, j2, j3, j4] = jobs(4);
      const one = together(bound, [j1, j2] as Envelope[]);
      await sleep(BATCH.maxWaitMs + 20); // batch one has gone: jobs 3 and 4 make batch two
      const two = together(bound, [j3, j4] as Envelope[]);
      const results = [...(await one), ...(await two)];
      if (reruns) {
        // Concurrent: each batch's updates are sent at once, so batch two
        // waits for both rows behind batch one, and no cycle forms.
        expect(results.map((r) => r.outcome)).toEqual(Array(4).fill("success"));
        expect(await stateOf(c, [j1, j2, j3, j4] as Envelope[])).toMatchObject({ effects: 4, fences: 4 });
        return;
      }
      expect(results.filter((r) => r.outcome === "success")).toHaveLength(3);
      const retried = results.findIndex((r) => r.outcome === "retry");
      expect(retried).toBeGreaterThanOrEqual(0);
      const all = [j1, j2, j3, j4] as Envelope[];
      expect(await bound.deliver({ body: JSON.stringify(all[retried]), deliveryCount: 2 })).toMatchObject({
        outcome: "success",
      });
      expect(await stateOf(c, all)).toMatchObject({ effects: 4, fences: 4 });
    });
  }
});

// postgres.js without the #1208 patch runs inside its own begin(), which
// fails a whole transaction after any failed statement, even one a savepoint
// undid: there a batched consumer runs one job per transaction
// (DriverConnection.batches), every outcome the same.
describe.each(unpatched)("on %s", (c) => {
  const batched = batchedAs("concurrent");
  test("a batched consumer runs one job per transaction: 8 jobs, 8 transactions, a failing one retried alone", async () => {
    let fail = true;
    const { definition } = batched(async (n) => {
      if (n === 2 && fail) throw new Error("partner down");
    });
    const bound = bindConsumer(definition, { db: c.db(2), logger: silentLogger });
    const batch = jobs(8);
    const results = await together(bound, batch);
    expect(results[1]).toMatchObject({ outcome: "retry", spendsAttempt: true });
    expect(results.filter((r) => r.outcome === "success")).toHaveLength(7);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 7, fences: 7, transactions: 7 });
    fail = false;
    expect((await together(bound, batch, 2)).filter((r) => r.outcome === "duplicate")).toHaveLength(7);
    expect(await stateOf(c, batch)).toMatchObject({ effects: 8, fences: 8, letters: 0 });
  });
});
