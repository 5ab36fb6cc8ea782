/**
 * Batched work transactions through a transport (#23 item 1): the in-process
 * adapter's concurrent deliveries of one consumer gather into batches, every
 * job applied once, copies included, in far fewer transactions than jobs.
 */
import { describe, expect, test } from "vitest";
import { effects, silentLogger, testConsumers, useEffectsDatabase } from "../../test/fixtures.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";

const pg = useEffectsDatabase("batch-memory");
const consumer = testConsumers("batch-memory");

describe("a batched consumer on the in-process adapter", () => {
  test.each([
    ["sequential", false],
    ["concurrent", true],
  ])(
    "%s handlers: 200 jobs and 40 copies, 8 in flight: each job applied once, in at most a third as many transactions, every copy a duplicate",
    async (_, concurrent) => {
      let failOnce = true;
      const definition = consumer(
        async (data, { tx, envelope }) => {
          await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
          // One job fails once: it is retried alone, its batch commits.
          if (data.n === 50 && failOnce) {
            failOnce = false;
            throw new Error("transient");
          }
        },
        { batch: { maxSize: 8, maxWaitMs: 5, concurrent }, retry: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 10 } },
      );
      const queue = createMemoryQueue({ concurrency: 8 });
      const outcomes = new Map<string, number>();
      queue.subscribe(bindConsumer(definition, { db: pg.db, logger: silentLogger }));
      queue.onDelivery((event) => outcomes.set(event.result.outcome, (outcomes.get(event.result.outcome) ?? 0) + 1));
      const jobs = Array.from({ length: 200 }, (_, i) =>
        createEnvelope({ tenantId: "t", kind: "test.v1", data: { n: i } }),
      );
      for (const job of jobs) await queue.publish(definition.queue, job);
      for (const job of jobs.slice(0, 40)) await queue.publish(definition.queue, job);
      await queue.drain();
      await queue.close();

      const [row] = await pg.sql<{ effects: number; distinct_jobs: number; fences: number; transactions: number }[]>`
      select (select count(*)::int from test_effects) as effects,
             (select count(distinct job_id)::int from test_effects) as distinct_jobs,
             (select count(*)::int from core.processed_jobs where consumer = ${definition.name}) as fences,
             (select count(distinct xmin::text)::int from core.processed_jobs where consumer = ${definition.name}) as transactions`;
      expect(row).toMatchObject({ effects: 200, distinct_jobs: 200, fences: 200 });
      expect(row?.transactions).toBeLessThanOrEqual(200 / 3);
      expect(outcomes.get("success")).toBe(200);
      expect(outcomes.get("duplicate")).toBe(40);
      // Concurrent: a failing run in a batch of several is rolled back with its
      // batch, which runs again one handler after another, where job 50 runs
      // clean: no retry (one, if job 50 happened to be alone in its batch).
      if (concurrent) expect(outcomes.get("retry") ?? 0).toBeLessThanOrEqual(1);
      else expect(outcomes.get("retry")).toBe(1);
      expect([...outcomes.keys()].filter((o) => !["success", "duplicate", "retry"].includes(o))).toEqual([]);
    },
  );
});
