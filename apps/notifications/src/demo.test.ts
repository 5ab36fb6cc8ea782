import { useModuleDatabase } from "@softcrum/core/testing";
import { describe, expect, test } from "vitest";
import { type NotificationsSceneSummary, runNotificationsScene, SCENE_TENANTS } from "./demo-scenario.ts";

const pg = useModuleDatabase("notifications-demo");

/** The lines `pnpm demo` prints for the notifications scene, as numbers. */
function expectTheScene(summary: NotificationsSceneSummary) {
  const { blast, burst, fanOut } = summary;
  expect(blast).toMatchObject({
    recipients: 1_050,
    chunks: 11,
    chunkJobsPublished: 22,
    batchCallsAccepted: 11,
    // The storm is seeded and the lanes fix the order of requests: the same 429s every run.
    rateLimited429s: 21,
    rateLimitedBatchCalls: 7,
    emailsSent: 1_050,
    duplicateEmails: 0,
    recordedChunkSends: 11,
    recordedOnFirstAttempt: 11,
    recordedRecipientIds: 1_050,
  });
  expect(blast.chunkOutcomes).toMatchObject({ success: 11, duplicate: 11 });
  expect(Object.keys(blast.chunkOutcomes).sort()).toEqual(["duplicate", "rate_limited", "success", "yielded"]);
  // Every transactional e-mail went out before any chunk still waiting when it was published.
  expect(burst).toMatchObject({
    atChunk: 4,
    published: 20,
    sent: 20,
    chunksSentBefore: 3,
    chunksWaiting: 7,
    sentBeforeWaitingChunks: 20,
  });
  expect(burst.marketingYields).toBeGreaterThan(0);
  expect(burst.marketingYields).toBe(blast.chunkOutcomes.yielded);
  // The tick run twice: N tenants, 2N publishes of N job_ids, N effects.
  expect(fanOut).toMatchObject({
    runs: 2,
    tenants: SCENE_TENANTS.length,
    published: 2 * SCENE_TENANTS.length,
    distinctJobIds: SCENE_TENANTS.length,
    applied: SCENE_TENANTS.length,
    skippedDuplicates: SCENE_TENANTS.length,
    digestsSent: SCENE_TENANTS.length,
  });
  expect(fanOut.tick).toMatch(/T00:00:00\.000Z$/);
  expect(summary.deadLetters).toBe(0);
  expect(summary.simulatedMs).toBeGreaterThan(summary.sceneMs);
  expect(summary.ok).toBe(true);
}

describe("the notifications scene of pnpm demo (#20)", () => {
  test("on the embedded PGlite, as pnpm demo runs it", async () => {
    const summary = await runNotificationsScene();
    expect(summary.database).toBe("pglite");
    expectTheScene(summary);
  });

  test("the same scene on real Postgres gives the same numbers", async () => {
    const summary = await runNotificationsScene({ databaseUrl: pg.url });
    expect(summary.database).toBe("postgres");
    expectTheScene(summary);
    const [fences] = await pg.sql<{ chunks: number; emails: number; digests: number }[]>`
      select count(*) filter (where consumer = 'notifications.blast-chunk')::int as chunks,
             count(*) filter (where consumer = 'notifications.transactional-email')::int as emails,
             count(*) filter (where consumer = 'notifications.demo-digest')::int as digests
        from core.processed_jobs`;
    expect(fences).toEqual({ chunks: 11, emails: 20, digests: SCENE_TENANTS.length });
  });
});
