import { useTestDatabase } from "@softcrum/testing";
import { describe, expect, test } from "vitest";
import { runDemo } from "./demo-scenario.ts";

const pg = useTestDatabase("loyalty-demo");

describe("the loyalty demo", () => {
  test("on real Postgres: duplicates are skipped, retries apply once, failures are dead-lettered, balances match", async () => {
    const summary = await runDemo({ databaseUrl: pg.url });
    expect(summary.database).toBe("postgres");
    expect(summary.outcomes).toMatchObject({
      success: 79,
      duplicate: 10,
      retry: 10,
      dead_lettered: 2,
      poison: 3,
      thrown: 0,
    });
    // The partner's failures retry or dead-letter its notifications, never the credits (#9 item 3).
    expect(summary.outcomesByConsumer).toEqual({
      "loyalty.award-points": { success: 40, duplicate: 10, dead_lettered: 1, poison: 3 },
      "loyalty.notify-partner": { success: 39, retry: 10, dead_lettered: 1 },
    });
    expect(summary.creditsApplied).toBe(40);
    expect(summary.partnerNotifications).toBe(39);
    expect(summary.deadLetters).toEqual({ exhausted: 1, permanent: 1, poison: 3 });
    expect(summary.balances.every((b) => b.points === b.expected)).toBe(true);
    expect(summary.balances).toHaveLength(10);
    expect(summary.ok).toBe(true);

    const [ledger] = await pg.sql<{ rows: number; jobs: number }[]>`
      select count(*)::int as rows, count(distinct job_id)::int as jobs from loyalty.ledger`;
    expect(ledger).toEqual({ rows: 40, jobs: 40 });
    // Every credit wrote one notification to the outbox, and each was published.
    const [outbox] = await pg.sql<{ rows: number; published: number }[]>`
      select count(*)::int as rows, count(published_at)::int as published from core.outbox`;
    expect(outbox).toEqual({ rows: 40, published: 40 });
  });

  test("a second run on the same database reports only its own effects", async () => {
    const summary = await runDemo({ databaseUrl: pg.url });
    expect(summary.ok).toBe(true);
    expect(summary.creditsApplied).toBe(40);
  });

  test("with no database configured it runs on the embedded PGlite", async () => {
    const summary = await runDemo({ databaseUrl: null });
    expect(summary.database).toBe("pglite");
    expect(summary.ok).toBe(true);
    expect(summary.outcomes.success).toBe(79);
  });
});
