import { createEnvelope, InvalidConfigError } from "@softcrum/core";
import { toVercelTopic } from "@softcrum/core/adapters/vercel";
import { NotMigratedError } from "@softcrum/core/migrate";
import { uniqueDatabaseName, useModuleDatabase, withDatabase } from "@softcrum/core/testing";
import postgres from "postgres";
import { afterEach, describe, expect, test } from "vitest";
import { startFakeVercelQueues } from "../../../packages/core/test/fake-vercel-queues.ts";
import { AWARD_POINTS_QUEUE, type PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule } from "./composition-root.ts";

const pg = useModuleDatabase("loyalty-root");
const accepting: PartnerNotifier = { pointsAwarded: async () => {} };
const quiet = { warn: () => {}, error: () => {} };
const saved = process.env["SOFTCRUM_QUEUE"];

afterEach(() => {
  if (saved === undefined) delete process.env["SOFTCRUM_QUEUE"];
  else process.env["SOFTCRUM_QUEUE"] = saved;
});

const award = (customerId: string, points: number) =>
  createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId, points, reason: "purchase" } });

describe("the composition root", () => {
  test("SOFTCRUM_QUEUE=vercel binds Vercel Queues: an award published through it reaches the route and is credited once", async () => {
    process.env["SOFTCRUM_QUEUE"] = "vercel";
    const fake = await startFakeVercelQueues();
    const module = await createLoyaltyModule({
      databaseUrl: pg.url,
      notifier: accepting,
      logger: quiet,
      vercel: { ...fake.clientOptions(), env: {} },
    });
    try {
      expect(module.transport).toBe("vercel");
      if (module.transport !== "vercel") return;
      fake.subscribePush(toVercelTopic(AWARD_POINTS_QUEUE), module.awardPointsRoute);
      const job = award("c-root", 25);
      await module.queue.publish(AWARD_POINTS_QUEUE, job);
      await module.queue.publish(AWARD_POINTS_QUEUE, job); // a duplicate
      await fake.dispatch();
      expect(fake.callbacks.map((c) => c.status)).toEqual([200, 200]);
      const rows = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from loyalty.ledger where job_id = ${job.job_id}`;
      expect(rows[0]?.n).toBe(1);
      expect(fake.sends.every((s) => s.idempotencyKey === undefined)).toBe(true);
    } finally {
      await module.close();
      await fake.close();
    }
  });

  test("without SOFTCRUM_QUEUE the module runs on the in-process adapter", async () => {
    delete process.env["SOFTCRUM_QUEUE"];
    const module = await createLoyaltyModule({ databaseUrl: pg.url, notifier: accepting, logger: quiet });
    try {
      expect(module.transport).toBe("memory");
      if (module.transport !== "memory") return;
      const job = award("c-memory", 5);
      await module.queue.publish(AWARD_POINTS_QUEUE, job);
      await module.queue.drain();
      const rows = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from loyalty.ledger where job_id = ${job.job_id}`;
      expect(rows[0]?.n).toBe(1);
    } finally {
      await module.close();
    }
  });

  test("SOFTCRUM_QUEUE=vercel without Vercel settings, or without DATABASE_URL, fails at start with a clear error", async () => {
    process.env["SOFTCRUM_QUEUE"] = "vercel";
    await expect(
      createLoyaltyModule({ databaseUrl: pg.url, notifier: accepting, logger: quiet, vercel: { env: {} } }),
    ).rejects.toThrow(/region: pass options.region or set VERCEL_REGION/);
    await expect(createLoyaltyModule({ databaseUrl: null, notifier: accepting, logger: quiet })).rejects.toThrow(
      /needs DATABASE_URL/,
    );
    process.env["SOFTCRUM_QUEUE"] = "sqs";
    await expect(createLoyaltyModule({ databaseUrl: pg.url, notifier: accepting })).rejects.toBeInstanceOf(
      InvalidConfigError,
    );
  });

  test("with DATABASE_URL on a database not yet migrated, the module refuses to start, says to run `pnpm db:migrate` and migrates nothing (#9 item 4)", async () => {
    const name = uniqueDatabaseName("softcrum_t", "loyalty_unmigrated");
    await pg.sql`create database ${pg.sql(name)}`;
    try {
      const url = withDatabase(pg.url, name);
      const refused = await createLoyaltyModule({ databaseUrl: url, notifier: accepting, logger: quiet }).catch(
        (error: unknown) => error,
      );
      expect(refused).toBeInstanceOf(NotMigratedError);
      expect((refused as Error).message).toMatch(/not migrated .* run `DATABASE_URL=… pnpm db:migrate`/);
      // Nothing was created there.
      const other = postgres(url, { max: 1, onnotice: () => {} });
      try {
        const schemas = await other`select nspname from pg_namespace where nspname in ('core', 'loyalty', 'drizzle')`;
        expect(schemas).toEqual([]);
      } finally {
        await other.end({ timeout: 5 });
      }
    } finally {
      await pg.sql`drop database if exists ${pg.sql(name)} with (force)`;
    }
  });
});
