/**
 * The notifications scene of `pnpm demo` (#20): three things an e-mail
 * module gets wrong under an at-least-once queue, run through the module as
 * it is (the harness, both lanes, the rate limits, the real Resend SDK)
 * against a fake Resend API on 127.0.0.1 (test/fake-resend.ts), and counted:
 *
 * 1. A blast started twice (a retried request): every chunk job arrives
 *    twice, and a 429 storm hits Resend's answers — 4 in a row, then a
 *    seeded 30%. Each chunk must be one accepted batch call, each recipient
 *    one e-mail.
 * 2. A burst of transactional e-mails published while a chunk is at Resend,
 *    with chunks still waiting: the marketing lane yields until every one of
 *    them is sent.
 * 3. A daily per-tenant fan-out tick run twice at once (a retried cron while
 *    the worker's loop fired too): the same job_ids twice, one digest e-mail
 *    per tenant.
 *
 * Time is a manual clock: backoffs, Retry-After and the rate limiters' waits
 * are moved through (`settle()` jumps to the next due delivery), not slept.
 * Each consumer takes one delivery at a time, so "waiting" below means
 * exactly the chunks no delivery had picked up when the burst came (with
 * more in flight, a chunk already past the yield check would still go out).
 */
import {
  type AnyPgDatabase,
  bindConsumer,
  createManualClock,
  type DeliveryOutcome,
  defineConsumer,
  fanOut,
  inProcessLaneBacklog,
  inProcessRateLimiter,
  type QueuePort,
  type RateLimiter,
  type TenantSource,
  tickAt,
} from "@softcrum/core";
import type { DeliveryEvent } from "@softcrum/core/adapters/memory";
import { and, asc, count, eq, gt, isNotNull, sql } from "drizzle-orm";
import { Resend } from "resend";
import { z } from "zod";
import { type FakeResend, startFakeResend } from "../test/fake-resend.ts";
import { createNotificationsModule, newBlastId } from "./composition-root.ts";
import { addContacts } from "./contacts.ts";
import { emailLimits } from "./email-lanes.ts";
import { sentOrThrow } from "./resend-results.ts";
import { blastChunkSends, blastRecipients, contacts } from "./schema.ts";

/** The blast's audience: 10 full chunks and one of 50. */
export const SCENE_RECIPIENTS = 1_050;
/** Transactional e-mails published in the middle of the blast. */
export const SCENE_BURST = 20;
/**
 * The burst is published while this chunk (1-based, in the order Resend
 * accepts them) is at Resend: with more chunks than this, some are waiting.
 */
export const SCENE_BURST_AT_CHUNK = 4;
/** Resend's 429s during the blast: the first `inARow` requests, then a seeded `fraction` of all. */
export const SCENE_STORM = { inARow: 4, inARowRetryAfterS: 2, fraction: 0.3, seed: 20, retryAfterS: 1 } as const;
/** The tenants in the store: the blast's (acme) and eleven more, each with a few contacts. */
export const SCENE_TENANTS = [
  "acme",
  "bloom",
  "cobalt",
  "delta",
  "ember",
  "fjord",
  "garnet",
  "harbor",
  "iris",
  "juniper",
  "kestrel",
  "lumen",
] as const;

const DAY_MS = 86_400_000;
const CHUNK = "notifications.blast-chunk";
const DIGEST = "notifications.demo-digest";
const DIGEST_QUEUE = "notifications.demo-digest";
const DIGEST_KIND = "notifications.demo-digest.v1";
const FAILURES: readonly (DeliveryOutcome | "thrown")[] = ["dead_lettered", "poison", "dead_letter_failed", "thrown"];

export interface NotificationsSceneSummary {
  readonly database: "postgres" | "pglite";
  /** Simulated time the scene covered (the manual clock), in ms. */
  readonly simulatedMs: number;
  /** Real time, in ms: opening the database (PGlite: starting and migrating it), then the scene itself. */
  readonly startupMs: number;
  readonly sceneMs: number;
  readonly blast: {
    readonly tenant: string;
    readonly recipients: number;
    readonly chunks: number;
    /** Chunk jobs published over both starts (2 × chunks). */
    readonly chunkJobsPublished: number;
    /** Chunk deliveries: applied, skipped by the fence, deferred by a rate limit or a 429, yielded to transactional. */
    readonly chunkOutcomes: Readonly<Partial<Record<DeliveryOutcome | "thrown", number>>>;
    /** Batch requests Resend accepted: must be one per chunk. */
    readonly batchCallsAccepted: number;
    /** Requests Resend answered 429 during the blast (the burst's included), and how many of them were batch calls. */
    readonly rateLimited429s: number;
    readonly rateLimitedBatchCalls: number;
    /** E-mails Resend accepted through the batch endpoint: must be one per recipient. */
    readonly emailsSent: number;
    /** Blast e-mails beyond the first to the same address: must be 0. */
    readonly duplicateEmails: number;
    /** What the module recorded in its work transactions. */
    readonly recordedChunkSends: number;
    /** Chunk sends committed by the harness's first attempt (a 429 or a rate limit spends none). */
    readonly recordedOnFirstAttempt: number;
    readonly recordedRecipientIds: number;
  };
  readonly burst: {
    /** The chunk (1-based, in the order Resend accepted them) that was at Resend when the burst was published. */
    readonly atChunk: number;
    readonly published: number;
    /** Transactional e-mails Resend accepted. */
    readonly sent: number;
    /** Chunks Resend had accepted when the burst was published (the one at Resend then not included). */
    readonly chunksSentBefore: number;
    /** Chunks no delivery had picked up yet when the burst was published. */
    readonly chunksWaiting: number;
    /** Burst e-mails Resend accepted before the first batch request of a waiting chunk reached it. */
    readonly sentBeforeWaitingChunks: number;
    /** Marketing deliveries that yielded to the transactional backlog. */
    readonly marketingYields: number;
  };
  readonly fanOut: {
    readonly tick: string;
    readonly runs: number;
    readonly tenants: number;
    /** Jobs published over both runs (2 × tenants). */
    readonly published: number;
    /** Distinct job_ids among them (one per tenant). */
    readonly distinctJobIds: number;
    readonly applied: number;
    readonly skippedDuplicates: number;
    /** Digest e-mails Resend accepted: the effect, one per tenant. */
    readonly digestsSent: number;
  };
  /** Deliveries that ended in a dead letter (or crashed), all consumers: must be 0. */
  readonly deadLetters: number;
  readonly ok: boolean;
}

export interface NotificationsSceneOptions {
  /** Postgres URL (migrated), or null for an embedded PGlite migrated at start. @default null */
  readonly databaseUrl?: string | null;
}

export async function runNotificationsScene(
  options: NotificationsSceneOptions = {},
): Promise<NotificationsSceneSummary> {
  const startedReal = performance.now();
  const fake = await startFakeResend();
  const clock = createManualClock();
  const startedAt = clock.now();
  const now = () => clock.now();
  // One Resend bucket for every consumer that calls it, the digest's too.
  const rateLimiter = inProcessRateLimiter({ now });
  const module = await createNotificationsModule({
    databaseUrl: options.databaseUrl ?? null,
    resendApiKey: fake.apiKey,
    resendBaseUrl: fake.url,
    clock,
    rateLimiter,
    // Read on every admission (the default reuses a read for 10 ms), so a chunk
    // picked up right after the burst already sees it: the line printed holds exactly.
    laneBacklog: inProcessLaneBacklog({ now, refreshMs: 0 }),
    concurrency: 1,
    logger: { warn: () => {}, error: (m) => console.error(m) },
  }).catch(async (error: unknown) => {
    await fake.close();
    throw error;
  });
  const startupMs = Math.round(performance.now() - startedReal);
  const sceneStarted = performance.now();
  const events: DeliveryEvent[] = [];
  module.queue.onDelivery((event) => events.push(event));
  try {
    for (const tenant of SCENE_TENANTS) {
      const n = tenant === "acme" ? SCENE_RECIPIENTS : 3;
      await addContacts(
        module.db,
        tenant,
        Array.from({ length: n }, (_, i) => ({ email: `reader-${String(i).padStart(5, "0")}@${tenant}.example` })),
      );
    }

    const blast = await blastScene(module, fake);
    const fanOutResult = await fanOutScene(module, fake, rateLimiter, now);

    const outcomesOf = (consumer: string) => {
      const counts: Partial<Record<DeliveryOutcome | "thrown", number>> = {};
      for (const e of events) {
        if (e.consumer === consumer) counts[e.result.outcome] = (counts[e.result.outcome] ?? 0) + 1;
      }
      return counts;
    };
    const chunkOutcomes = outcomesOf(CHUNK);
    const digestOutcomes = outcomesOf(DIGEST);
    const deadLetters = events.filter((e) => FAILURES.includes(e.result.outcome)).length;
    const summary = {
      database: module.database,
      simulatedMs: clock.now() - startedAt,
      startupMs,
      sceneMs: Math.round(performance.now() - sceneStarted),
      blast: { ...blast.blast, chunkOutcomes },
      burst: { ...blast.burst, marketingYields: chunkOutcomes.yielded ?? 0 },
      fanOut: {
        ...fanOutResult,
        applied: digestOutcomes.success ?? 0,
        skippedDuplicates: digestOutcomes.duplicate ?? 0,
      },
      deadLetters,
    };
    const b = summary.blast;
    const t = summary.burst;
    const f = summary.fanOut;
    const ok =
      b.chunks === Math.ceil(b.recipients / 100) &&
      b.chunkJobsPublished === 2 * b.chunks &&
      b.chunkOutcomes.success === b.chunks &&
      b.chunkOutcomes.duplicate === b.chunks &&
      b.batchCallsAccepted === b.chunks &&
      b.emailsSent === b.recipients &&
      b.duplicateEmails === 0 &&
      b.recordedChunkSends === b.chunks &&
      b.recordedOnFirstAttempt === b.chunks &&
      b.recordedRecipientIds === b.recipients &&
      t.sent === t.published &&
      t.sentBeforeWaitingChunks === t.published &&
      f.published === 2 * f.tenants &&
      f.distinctJobIds === f.tenants &&
      f.applied === f.tenants &&
      f.skippedDuplicates === f.tenants &&
      f.digestsSent === f.tenants &&
      deadLetters === 0;
    return { ...summary, ok };
  } finally {
    await module.close();
    await fake.close();
  }
}

type SceneModule = Awaited<ReturnType<typeof createNotificationsModule>>;

/** Scenes 1 and 2: the blast, started twice, under a 429 storm, with a transactional burst in the middle. */
async function blastScene(module: SceneModule, fake: FakeResend) {
  const tenant = "acme";
  const blastId = newBlastId();
  const input = {
    blastId,
    tenantId: tenant,
    message: {
      from: "Acme News <news@acme.example>",
      subject: "Our winter sale",
      html: "<p>Everything half off.</p>",
      text: "Everything half off.",
    },
  };

  // The burst goes out from inside Resend's handling of a chunk's request: that
  // chunk is at Resend, the ones before it are sent, the rest are waiting.
  const atChunk = Math.min(SCENE_BURST_AT_CHUNK, Math.ceil(SCENE_RECIPIENTS / 100));
  let burst: { seq: number; chunksSentBefore: number; jobIds: Set<string> } | undefined;
  fake.beforeAccept(async (request) => {
    if (burst !== undefined || request.path !== "/emails/batch") return;
    const sent = fake.count("accepted", "/emails/batch");
    if (sent !== atChunk - 1) return;
    burst = { seq: request.seq, chunksSentBefore: sent, jobIds: new Set() };
    for (let i = 0; i < SCENE_BURST; i++) {
      const envelope = await module.sendTransactionalEmail({
        tenantId: tenant,
        to: `buyer-${String(i).padStart(2, "0")}@example.com`,
        from: "Acme <orders@acme.example>",
        subject: `Your receipt #${1001 + i}`,
        text: "Thanks for your order.",
      });
      burst.jobIds.add(envelope.job_id);
    }
  });
  fake.rateLimitNext(SCENE_STORM.inARow, SCENE_STORM.inARowRetryAfterS);
  fake.rateLimitFraction(SCENE_STORM.fraction, { seed: SCENE_STORM.seed, retryAfterSeconds: SCENE_STORM.retryAfterS });
  const first = await module.startBlast(input);
  // The same request again, as a client retrying it would: the same 11 job_ids again.
  const second = await module.startBlast(input);
  await module.settle();
  fake.rateLimitFraction(0);
  fake.beforeAccept(undefined);
  if (burst === undefined) throw new Error(`the blast never reached chunk ${atChunk}`);

  const batchEmails = fake.emails.filter((e) => e.endpoint === "/emails/batch");
  const perAddress = new Map<string, number>();
  for (const e of batchEmails) for (const to of e.to) perAddress.set(to, (perAddress.get(to) ?? 0) + 1);
  const burstSeq = burst.seq;
  const firstWaitingBatch = Math.min(
    ...fake.requests.filter((r) => r.path === "/emails/batch" && r.seq > burstSeq).map((r) => r.seq),
  );
  const burstSent = fake.requests.filter((r) => r.path === "/emails" && r.outcome === "accepted");
  const [chunkSends] = await module.db
    .select({ n: count(), firstAttempt: count(sql`case when ${blastChunkSends.attempt} = 1 then 1 end`) })
    .from(blastChunkSends)
    .where(eq(blastChunkSends.blastId, blastId));
  const [recipientIds] = await module.db
    .select({ n: count() })
    .from(blastRecipients)
    .where(and(eq(blastRecipients.blastId, blastId), isNotNull(blastRecipients.providerEmailId)));
  return {
    blast: {
      tenant,
      recipients: first.recipients,
      chunks: first.chunks,
      chunkJobsPublished: first.published + second.published,
      batchCallsAccepted: fake.count("accepted", "/emails/batch"),
      rateLimited429s: fake.count("rate_limited"),
      rateLimitedBatchCalls: fake.count("rate_limited", "/emails/batch"),
      emailsSent: batchEmails.length,
      duplicateEmails: [...perAddress.values()].reduce((sum, n) => sum + n - 1, 0),
      recordedChunkSends: chunkSends?.n ?? 0,
      recordedOnFirstAttempt: chunkSends?.firstAttempt ?? 0,
      recordedRecipientIds: recipientIds?.n ?? 0,
    },
    burst: {
      atChunk,
      published: burst.jobIds.size,
      sent: burstSent.length,
      chunksSentBefore: burst.chunksSentBefore,
      chunksWaiting: first.chunks - burst.chunksSentBefore - 1,
      sentBeforeWaitingChunks: burstSent.filter((r) => r.seq < firstWaitingBatch).length,
    },
  };
}

/** Scene 3: one daily tick of a per-tenant digest, run twice at once. */
async function fanOutScene(module: SceneModule, fake: FakeResend, rateLimiter: RateLimiter, now: () => number) {
  const consumer = createDigestConsumer(new Resend(fake.apiKey, { baseUrl: fake.url }));
  module.queue.subscribe(
    bindConsumer(consumer, {
      db: module.db,
      rateLimiter,
      now,
      logger: { warn: () => {}, error: (m) => console.error(m) },
    }),
  );
  const tick = tickAt(now(), DAY_MS);
  // The queue as fan-out sees it, noting each job_id it publishes.
  const published: string[] = [];
  const recording: QueuePort = {
    publish: (queue, envelope, opts) => {
      published.push(envelope.job_id);
      return module.queue.publish(queue, envelope, opts);
    },
    schedule: (queue, envelope, runAt) => {
      published.push(envelope.job_id);
      return module.queue.schedule(queue, envelope, runAt);
    },
  };
  const run = () =>
    fanOut({
      queue: recording,
      queueName: DIGEST_QUEUE,
      kind: DIGEST_KIND,
      tick,
      tenants: tenantsWithContacts(module.db),
      pageSize: 5,
    });
  // A retried cron while the worker's own loop fired for the same tick.
  const reports = await Promise.all([run(), run()]);
  await module.settle();
  const digestEmails = fake.emails.filter((e) => e.idempotencyKey?.startsWith("digest/"));
  return {
    tick: tick.toISOString(),
    runs: reports.length,
    tenants: reports[0]?.tenants ?? 0,
    published: reports.reduce((sum, r) => sum + r.published, 0),
    distinctJobIds: new Set(published).size,
    digestsSent: digestEmails.length,
  };
}

/** The store's tenants, a keyset page at a time: every tenant with a contact. */
function tenantsWithContacts(db: AnyPgDatabase): TenantSource {
  return async ({ after, limit }) =>
    (
      await db
        .selectDistinct({ tenantId: contacts.tenantId })
        .from(contacts)
        .where(after === null ? undefined : gt(contacts.tenantId, after))
        .orderBy(asc(contacts.tenantId))
        .limit(limit)
    ).map((r) => r.tenantId);
}

/**
 * The scene's per-tenant job: a daily digest e-mail to the tenant's owner,
 * with its subscribed contacts counted in the work transaction. Demo only
 * (not part of the module); built like the module's consumers: Resend's
 * bucket, an idempotency key from the job_id, the fence.
 */
function createDigestConsumer(resend: Pick<Resend, "emails">) {
  return defineConsumer({
    name: DIGEST,
    queue: DIGEST_QUEUE,
    kind: DIGEST_KIND,
    schema: z.object({ tick: z.string() }),
    limits: emailLimits(),
    async handle(data, { tx, envelope, signal }) {
      const [row] = await tx.select({ n: count() }).from(contacts).where(eq(contacts.tenantId, envelope.tenant_id));
      const result = await resend.emails.send(
        {
          from: "Softcrum <digest@softcrum.example>",
          to: [`owner@${envelope.tenant_id}.example`],
          subject: `Your daily digest for ${data.tick.slice(0, 10)}`,
          text: `${row?.n ?? 0} contacts in your list.`,
        },
        { idempotencyKey: `digest/${envelope.job_id}`, signal },
      );
      sentOrThrow(result, "POST /emails");
    },
  });
}
