// The notifications scene of `pnpm demo` (after the loyalty demo): a blast
// with a transactional burst in the middle and a 429 storm, then a fan-out
// tick run twice, each line a count you can check. An embedded PGlite (a fresh
// one each run) and a fake Resend API on 127.0.0.1, started here: no server.
import { runNotificationsScene, SCENE_STORM } from "./demo-scenario.ts";

const summary = await runNotificationsScene();
const n = (value: number) => value.toLocaleString("en-US");
const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const line = (label: string, text: string) => console.log(`${label.padEnd(16)} ${text}`);
const { blast: b, burst: t, fanOut: f } = summary;

console.log(
  `Softcrum notifications scene — database: ${summary.database === "pglite" ? "embedded PGlite" : "Postgres"}; Resend: the real SDK against a fake Resend API on 127.0.0.1`,
);
console.log(
  `Time is simulated (a manual clock): ${s(summary.simulatedMs)} of rate limits, Retry-After waits and backoff passed in ${s(summary.sceneMs)} of real time (after ${s(summary.startupMs)} starting the database).`,
);
console.log("");
line(
  "blast",
  `${n(b.recipients)} recipients of tenant ${b.tenant} → ${b.chunks} chunk jobs of ≤100 on notif.email.marketing`,
);
line(
  "",
  `started twice, as a retried request would: ${b.chunkJobsPublished} chunk jobs published, ${b.chunkOutcomes.success ?? 0} sent, ${b.chunkOutcomes.duplicate ?? 0} skipped by the fence`,
);
line(
  "batch calls",
  `${b.batchCallsAccepted} accepted by Resend (= chunks: one resend.batch.send each), ${b.recordedOnFirstAttempt} of them on the chunk's first attempt`,
);
line(
  "429s",
  `${b.rateLimited429s} answered by Resend (${b.rateLimitedBatchCalls} batch calls, ${b.rateLimited429s - b.rateLimitedBatchCalls} single e-mails; ${SCENE_STORM.inARow} in a row, then a seeded ${SCENE_STORM.fraction * 100}%): each deferred to its Retry-After, no attempt spent`,
);
line("e-mails sent", `${n(b.emailsSent)} (= recipients); duplicates ${b.duplicateEmails}`);
line(
  "recorded",
  `${b.recordedChunkSends} chunk sends and ${n(b.recordedRecipientIds)} Resend ids in the database, each with its job's fence`,
);
console.log("");
line(
  "transactional",
  `${t.published} receipts published while chunk ${t.atChunk} of ${b.chunks} was at Resend (${t.chunksSentBefore} chunks sent, ${t.chunksWaiting} waiting)`,
);
line(
  "",
  `${t.sentBeforeWaitingChunks} of ${t.published} sent before any waiting chunk reached Resend (${t.sent} sent in all); marketing deliveries yielded ${t.marketingYields} times meanwhile`,
);
console.log("");
line("fan-out", `a daily digest, tick ${f.tick}, run twice at once (a retried cron and the worker's loop)`);
line(
  "",
  `${f.tenants} tenants, ${f.published} publishes (${f.distinctJobIds} distinct job_ids), ${f.digestsSent} digests sent (${f.digestsSent - f.tenants} extra; ${f.skippedDuplicates} copies skipped by the fence)`,
);
line("dead letters", String(summary.deadLetters));
console.log("");
if (summary.ok) {
  console.log(
    "OK: one batch call per chunk and one e-mail per recipient despite duplicates and 429s; every transactional e-mail went out before the waiting chunks; one digest per tenant for the tick.",
  );
} else {
  console.log("FAILED: a count above differs from what it should be (the numbers in parentheses say what).");
  process.exitCode = 1;
}
console.log("");
console.log("What to try next:");
console.log(
  "  - change SCENE_RECIPIENTS, SCENE_BURST or the storm in apps/notifications/src/demo-scenario.ts, then: pnpm --filter @softcrum/example-notifications demo",
);
console.log(
  "  - pnpm --filter @softcrum/example-notifications bench:blast: the same kind of blast on a real Postgres (see README, Tests)",
);
console.log(
  "  - apps/notifications/README.md: chunks, idempotency keys, what each Resend answer means, and the lane yield",
);
