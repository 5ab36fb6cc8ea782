import { createEnvelope } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { uuidv7 } from "uuidv7";
import { beforeEach, describe, expect, test } from "vitest";
import { AWARD_POINTS_KIND, type PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule } from "./composition-root.ts";

const pg = useModuleDatabase("loyalty-award");
const quiet = { warn: () => {}, error: () => {} };

beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters, core.outbox, loyalty.ledger, loyalty.balances cascade`;
});

const award = (customerId: string, points: number) =>
  createEnvelope({ tenantId: "acme", kind: AWARD_POINTS_KIND, data: { customerId, points, reason: "purchase" } });

/** A partner that records, for each call, whether the credit it reports was already committed (seen from another connection). */
function observingPartner() {
  const calls: { jobId: string; idempotencyKey: string; creditCommitted: boolean }[] = [];
  const partner: PartnerNotifier = {
    async pointsAwarded(input) {
      const [row] = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from loyalty.ledger where job_id = ${input.jobId}`;
      calls.push({ jobId: input.jobId, idempotencyKey: input.idempotencyKey, creditCommitted: row?.n === 1 });
    },
  };
  return { partner, calls };
}

describe("award points tells the partner through the outbox", () => {
  test("the partner is called only after the credit committed, once, by the notify consumer (#9 item 3)", async () => {
    const { partner, calls } = observingPartner();
    const module = await createLoyaltyModule({
      databaseUrl: pg.url,
      transport: "memory",
      notifier: partner,
      logger: quiet,
    });
    try {
      if (module.transport !== "memory") throw new Error("expected the in-process adapter");
      const job = award("c-1", 10);
      await module.queue.publish("loyalty.points", job);
      await module.queue.publish("loyalty.points", job); // a duplicate
      await module.settle();
      expect(calls).toEqual([{ jobId: job.job_id, idempotencyKey: expect.any(String), creditCommitted: true }]);
      const [outbox] = await pg.sql<{ queue: string; kind: string; published: boolean }[]>`
        select queue, kind, published_at is not null as published from core.outbox`;
      expect(outbox).toEqual({
        queue: "loyalty.partner-notifications",
        kind: "partner.points-awarded.v1",
        published: true,
      });
    } finally {
      await module.close();
    }
  });

  test("a credit whose COMMIT is refused tells the partner nothing (#9 item 3)", async () => {
    const { partner, calls } = observingPartner();
    const module = await createLoyaltyModule({
      databaseUrl: pg.url,
      transport: "memory",
      notifier: partner,
      logger: quiet,
    });
    try {
      if (module.transport !== "memory") throw new Error("expected the in-process adapter");
      const job = award("c-2", 10);
      // A pending dead letter for this job: the fence's deferred trigger refuses the work's COMMIT.
      await pg.sql`
        insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${uuidv7()}, ${job.job_id}, 'loyalty.points', 'loyalty.award-points', ${JSON.stringify(job)}, 5,
                'earlier attempts failed', 'exhausted')`;
      const result = await module.awardPoints.deliver({ body: JSON.stringify(job), deliveryCount: 1 });
      expect(result.outcome).toBe("dead_lettered");
      await module.settle();
      expect(calls).toEqual([]);
      const [counts] = await pg.sql<{ ledger: number; outbox: number }[]>`
        select (select count(*)::int from loyalty.ledger) as ledger, (select count(*)::int from core.outbox) as outbox`;
      expect(counts).toEqual({ ledger: 0, outbox: 0 });
    } finally {
      await module.close();
    }
  });

  test("a partner outage retries and then dead-letters the notification; the credit stands (#9 item 3)", async () => {
    const module = await createLoyaltyModule({
      databaseUrl: pg.url,
      transport: "memory",
      notifier: {
        pointsAwarded: () => Promise.reject(new Error("partner statement service unavailable")),
      },
      retry: { maxAttempts: 2, baseDelayMs: 5, maxDelayMs: 5 },
      logger: quiet,
    });
    try {
      if (module.transport !== "memory") throw new Error("expected the in-process adapter");
      const job = award("c-3", 10);
      await module.queue.publish("loyalty.points", job);
      await module.settle();
      const ledger = await pg.sql<{ job_id: string }[]>`select job_id from loyalty.ledger`;
      expect(ledger.map((r) => r.job_id)).toEqual([job.job_id]);
      const letters = await pg.sql<{ consumer: string; error_class: string }[]>`
        select consumer, error_class from core.dead_letters`;
      expect(letters).toEqual([{ consumer: "loyalty.notify-partner", error_class: "exhausted" }]);
    } finally {
      await module.close();
    }
  });
});
