/**
 * core.transport_holds (#19): the deliveries a transport kept without
 * spending an attempt. What the Vercel adapter subtracts from the service's
 * delivery count must be exactly the holds of earlier deliveries of that
 * message for that consumer, on every driver; a successor's mark must reach
 * only the delivery it succeeds; the fence cleanup prunes expired holds.
 */
import { describe, expect, test } from "vitest";
import { useDriverMatrix } from "../../test/drivers.ts";
import { useEffectsDatabase } from "../../test/fixtures.ts";
import { createFenceCleanup } from "../maintenance/fence-cleanup.ts";
import { postgresTransportHolds } from "./transport-holds.ts";

const cases = useDriverMatrix("transport_holds", { isolations: ["read committed"] });

let run = 0;
/** Consumer names of their own per test: the server drivers share one database. */
const names = () => {
  run += 1;
  return [`holds.a${run}`, `holds.b${run}`] as const;
};

describe.each(cases)("the hold store on %s", (c) => {
  test("counts the holds of earlier deliveries of one message of one consumer, recorded once each", async () => {
    const db = c.db(2);
    const [a, b] = names();
    const holds = postgresTransportHolds(db, a, 5_000);
    const other = postgresTransportHolds(db, b, 5_000);
    await holds.record("m1", 1);
    await holds.record("m1", 1); // a route retried after a lost answer
    await holds.record("m1", 3);
    await holds.record("m2", 1);
    await other.record("m1", 2);
    expect(await holds.before("m1", 1)).toEqual({ holds: 0, succeeded: false });
    expect(await holds.before("m1", 2)).toEqual({ holds: 1, succeeded: false });
    expect(await holds.before("m1", 4)).toEqual({ holds: 2, succeeded: false });
    expect(await holds.before("m3", 9)).toEqual({ holds: 0, succeeded: false });
    expect(await other.before("m1", 9)).toEqual({ holds: 1, succeeded: false });
  });

  test("a successor marks the delivery it succeeds, not another delivery, message or consumer", async () => {
    const db = c.db(2);
    const [a, b] = names();
    const holds = postgresTransportHolds(db, a, 5_000);
    const other = postgresTransportHolds(db, b, 5_000);
    await holds.record("m1", 1);
    await other.record("m1", 1);
    await holds.succeeded("m1", 2); // no hold at delivery 2: nothing to mark
    await holds.succeeded("m2", 1);
    expect(await holds.before("m1", 3)).toEqual({ holds: 1, succeeded: false });
    await holds.succeeded("m1", 1);
    await holds.succeeded("m1", 1);
    expect(await holds.before("m1", 2)).toEqual({ holds: 1, succeeded: true });
    // The mark is seen only by deliveries after the kept one.
    expect(await holds.before("m1", 1)).toEqual({ holds: 0, succeeded: false });
    expect(await other.before("m1", 2)).toEqual({ holds: 1, succeeded: false });
  });
});

describe("bounds and pruning", () => {
  const pg = useEffectsDatabase("transport_holds_prune");

  test("a call that cannot get its row lock in time is given up on after timeoutMs (the transport keeps the message)", async () => {
    const holds = postgresTransportHolds(pg.db, "holds.slow", 300);
    await holds.record("m1", 1);
    // Another session holds the row: the mark waits on it.
    const blocker = pg.sql.begin(async (tx) => {
      await tx`select 1 from core.transport_holds where consumer = 'holds.slow' for update`;
      await tx`select pg_sleep(1.5)`;
    });
    await new Promise((r) => setTimeout(r, 100));
    await expect(holds.succeeded("m1", 1)).rejects.toMatchObject({ name: "TransportHoldTimeoutError" });
    await blocker;
  });

  test("the fence cleanup deletes the holds older than its TTL of the consumers it cleans, and no others", async () => {
    const HOUR = 3_600_000;
    await pg.sql`insert into core.transport_holds (consumer, message_key, delivery_count, held_at) values
      ('holds.old', 'a', 1, now() - interval '30 hours'),
      ('holds.old', 'b', 1, now() - interval '30 hours'),
      ('holds.old', 'b', 2, now() - interval '26 hours'),
      ('holds.old', 'c', 1, now() - interval '1 hour'),
      ('holds.elsewhere', 'a', 1, now() - interval '30 hours')`;
    const consumer = { name: "holds.old", retryPolicy: { maxAttempts: 5, baseDelayMs: 1_000, maxDelayMs: 10_000 } };
    const cleanup = createFenceCleanup({ db: pg.db, ttlMs: 24 * HOUR, consumers: [consumer], batchSize: 2 });
    expect((await cleanup.run({ dryRun: true })).holdsDeleted).toBe(0);
    expect(await pg.sql`select count(*)::int as n from core.transport_holds where consumer like 'holds.%'`).toEqual([
      { n: 6 },
    ]);
    const report = await cleanup.run();
    expect(report.holdsDeleted).toBe(3);
    const left = await pg.sql<{ consumer: string; message_key: string }[]>`
      select consumer, message_key from core.transport_holds order by consumer, message_key`;
    expect(left).toEqual([
      { consumer: "holds.elsewhere", message_key: "a" },
      { consumer: "holds.old", message_key: "c" },
      { consumer: "holds.slow", message_key: "m1" },
    ]);
  });
});
