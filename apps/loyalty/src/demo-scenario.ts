/**
 * The demo's job stream and its check. A stream with everything an
 * at-least-once queue brings: duplicates, transient failures, a job that never
 * succeeds, a business rejection and poison payloads. Each credit tells the
 * partner through the transactional outbox: the partner's failures retry (or
 * dead-letter) the notification, never the credit. The summary compares the
 * final balances with the ones the stream should produce, and the partner's
 * notifications with the credits.
 */
import { createEnvelope, type DeliveryOutcome, deadLetters, type Envelope, type RetryPolicy } from "@softcrum/core";
import type { DeliveryEvent } from "@softcrum/core/adapters/memory";
import { asc, inArray } from "drizzle-orm";
import { uuidv4 } from "uuidv7";
import { AWARD_POINTS_KIND, AWARD_POINTS_QUEUE, type AwardPoints, type PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule } from "./composition-root.ts";
import { balances, ledger } from "./schema.ts";

/**
 * The demo's retry policy: the platform default waits 30 s, 1 min, 2 min and
 * 4 min between attempts, which would make the demo last 7.5 minutes. These
 * delays keep the same shape (5 attempts, doubling, equal jitter) in under 2 s.
 */
export const DEMO_RETRY_POLICY: RetryPolicy = { maxAttempts: 5, baseDelayMs: 80, maxDelayMs: 1_000 };

const CLOSED_CUSTOMER = "c-closed";

/**
 * A partner that fails on purpose: `failuresByJob` says how many calls fail
 * for an award job before it answers. It counts what it applied, by
 * idempotency key (as a real partner de-duplicates) and by award job.
 */
class DemoPartner implements PartnerNotifier {
  readonly notified = new Set<string>();
  /** Award jobs the partner applied a notification for, with how many times: must be once each. */
  readonly appliedByJob = new Map<string, number>();
  readonly #calls = new Map<string, number>();
  constructor(readonly failuresByJob: Map<string, number>) {}

  async pointsAwarded(input: Parameters<PartnerNotifier["pointsAwarded"]>[0]) {
    const calls = (this.#calls.get(input.idempotencyKey) ?? 0) + 1;
    this.#calls.set(input.idempotencyKey, calls);
    const failures = this.failuresByJob.get(input.jobId) ?? 0;
    if (calls <= failures) throw new Error(`partner statement service timed out (call ${calls})`);
    if (this.notified.has(input.idempotencyKey)) return; // a repeat of an applied call
    this.notified.add(input.idempotencyKey);
    this.appliedByJob.set(input.jobId, (this.appliedByJob.get(input.jobId) ?? 0) + 1);
  }
}

export interface DemoSummary {
  readonly database: "postgres" | "pglite";
  readonly published: { readonly jobs: number; readonly duplicateCopies: number; readonly poison: number };
  readonly deliveries: number;
  readonly outcomes: Readonly<Record<DeliveryOutcome | "thrown", number>>;
  /** The same outcomes per consumer (award-points, notify-partner), only those that happened. */
  readonly outcomesByConsumer: Readonly<Record<string, Readonly<Record<string, number>>>>;
  readonly creditsApplied: number;
  readonly partnerNotifications: number;
  readonly deadLetters: Readonly<Record<string, number>>;
  /** Per customer: the points this run added to the balance, and the points the stream should add. */
  readonly balances: readonly { tenant: string; customer: string; points: number; expected: number }[];
  readonly ok: boolean;
}

/** A small deterministic PRNG, so every run publishes the same stream. */
function mulberry32(seed: number) {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export async function runDemo(options: { databaseUrl?: string | null } = {}): Promise<DemoSummary> {
  const random = mulberry32(7);
  const jobs: Envelope<AwardPoints>[] = [];
  for (let i = 0; i < 40; i++) {
    jobs.push(
      createEnvelope({
        tenantId: i % 2 === 0 ? "acme" : "globex",
        kind: AWARD_POINTS_KIND,
        data: { customerId: `c-${(i % 5) + 1}`, points: 1 + Math.floor(random() * 100), reason: "purchase" },
      }),
    );
  }
  const closed = createEnvelope({
    tenantId: "acme",
    kind: AWARD_POINTS_KIND,
    data: { customerId: CLOSED_CUSTOMER, points: 50, reason: "purchase" },
  });
  const pick = (i: number) => jobs[i]?.job_id ?? "";
  // The partner refuses three notifications twice, then accepts them; it never
  // accepts one (its notification exhausts 5 attempts; the credit stands).
  const failuresByJob = new Map([
    [pick(3), 2],
    [pick(11), 2],
    [pick(25), 2],
    [pick(17), Number.POSITIVE_INFINITY],
  ]);
  const partner = new DemoPartner(failuresByJob);

  const module = await createLoyaltyModule({
    databaseUrl: options.databaseUrl,
    transport: "memory",
    notifier: partner,
    closedCustomers: new Set([CLOSED_CUSTOMER]),
    retry: DEMO_RETRY_POLICY,
    logger: { warn: () => {}, error: (m) => console.error(m) },
  });
  // Against a real database the demo may run again: report what this run changed.
  const readBalances = async () =>
    new Map(
      (await module.db.select().from(balances).orderBy(asc(balances.tenantId), asc(balances.customerId))).map((r) => [
        `${r.tenantId}/${r.customerId}`,
        r.points,
      ]),
    );
  const before = await readBalances();
  const events: DeliveryEvent[] = [];
  module.queue.onDelivery((event) => events.push(event));
  try {
    for (const job of [...jobs, closed]) await module.queue.publish(AWARD_POINTS_QUEUE, job);
    // At-least-once: the first ten jobs arrive a second time.
    for (const job of jobs.slice(0, 10)) await module.queue.publish(AWARD_POINTS_QUEUE, job);
    // Poison: not JSON, a negative amount, a job_id that is not UUID v7.
    await module.queue.publishRaw(AWARD_POINTS_QUEUE, "{ this is not json");
    await module.queue.publishRaw(
      AWARD_POINTS_QUEUE,
      JSON.stringify({
        ...createEnvelope({ tenantId: "acme", kind: AWARD_POINTS_KIND, data: {} }),
        data: { customerId: "c-1", points: -5, reason: "x" },
      }),
    );
    await module.queue.publishRaw(AWARD_POINTS_QUEUE, JSON.stringify({ ...jobs[0], job_id: uuidv4() }));
    // Credits, then the notifications they committed to the outbox.
    await module.settle();

    const expected = new Map<string, number>();
    for (const job of jobs) {
      const key = `${job.tenant_id}/${job.data.customerId}`;
      expected.set(key, (expected.get(key) ?? 0) + job.data.points);
    }
    const after = await readBalances();
    const runJobIds = [...jobs, closed].map((j) => j.job_id);
    const ledgerRows = await module.db
      .select({ jobId: ledger.jobId })
      .from(ledger)
      .where(inArray(ledger.jobId, runJobIds));
    const deadLetterIds = events.flatMap((e) => ("deadLetterId" in e.result ? [e.result.deadLetterId] : []));
    const letters = await module.db
      .select({ errorClass: deadLetters.errorClass })
      .from(deadLetters)
      .where(inArray(deadLetters.id, deadLetterIds));

    const outcomes = {
      success: 0,
      duplicate: 0,
      retry: 0,
      rate_limited: 0,
      yielded: 0,
      deferred: 0,
      dead_lettered: 0,
      poison: 0,
      dead_letter_failed: 0,
      skipped: 0,
      thrown: 0,
    };
    const outcomesByConsumer: Record<string, Record<string, number>> = {};
    for (const event of events) {
      outcomes[event.result.outcome] += 1;
      const mine = outcomesByConsumer[event.consumer] ?? {};
      mine[event.result.outcome] = (mine[event.result.outcome] ?? 0) + 1;
      outcomesByConsumer[event.consumer] = mine;
    }
    const deadLetterCounts: Record<string, number> = {};
    for (const { errorClass } of letters) deadLetterCounts[errorClass] = (deadLetterCounts[errorClass] ?? 0) + 1;

    const balanceRows = [...after]
      .map(([key, points]) => {
        const [tenant = "", customer = ""] = key.split("/");
        return { tenant, customer, points: points - (before.get(key) ?? 0), expected: expected.get(key) ?? 0 };
      })
      .filter((b) => b.points !== 0 || b.expected !== 0);
    const appliedOnce = new Set(ledgerRows.map((r) => r.jobId)).size === ledgerRows.length;
    // Every credit was told to the partner exactly once, except the one it never accepts.
    const credited = new Set(ledgerRows.map((r) => r.jobId));
    const notifiedOnce =
      [...partner.appliedByJob].every(([jobId, times]) => times === 1 && credited.has(jobId)) &&
      partner.appliedByJob.size === credited.size - 1;
    const ok =
      appliedOnce &&
      notifiedOnce &&
      balanceRows.length === expected.size &&
      balanceRows.every((b) => b.points === b.expected) &&
      deadLetterCounts["exhausted"] === 1 &&
      deadLetterCounts["permanent"] === 1 &&
      deadLetterCounts["poison"] === 3;
    return {
      database: module.database,
      published: { jobs: jobs.length + 1, duplicateCopies: 10, poison: 3 },
      deliveries: events.length,
      outcomes,
      outcomesByConsumer,
      creditsApplied: ledgerRows.length,
      partnerNotifications: partner.notified.size,
      deadLetters: deadLetterCounts,
      balances: balanceRows,
      ok,
    };
  } finally {
    await module.close();
  }
}
