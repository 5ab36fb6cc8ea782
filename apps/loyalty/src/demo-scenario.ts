/**
 * The demo's job stream and its check. A stream with everything an
 * at-least-once queue brings: duplicates, transient failures, a job that never
 * succeeds, a business rejection and poison payloads. Each credit tells the
 * partner through the transactional outbox: the partner's failures retry (or
 * dead-letter) the notification, never the credit. The summary compares the
 * final balances with the ones the stream should produce, and the partner's
 * notifications with the credits.
 */
import {
  createEnvelope,
  type DeliveryOutcome,
  deadLetters,
  type Envelope,
  outbox,
  type RetryPolicy,
} from "@softcrum/core";
import type { DeliveryEvent } from "@softcrum/core/adapters/memory";
import { and, asc, count, inArray, isNotNull } from "drizzle-orm";
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

/** What one consumer was handed and what came of it. */
export interface ConsumerReport {
  /** The consumer's name (the `consumer` column of the fence and of dead letters). */
  readonly name: string;
  readonly queue: string;
  /** Deliveries: each one message handed to this consumer once. */
  readonly deliveries: number;
  /** Deliveries of a message for the first time (a duplicate copy is a message of its own). */
  readonly firstDeliveries: number;
  /** Deliveries of a message again, after an attempt that failed (`retry`). */
  readonly redeliveries: number;
  /** The harness's outcomes of those deliveries, only those that happened. */
  readonly outcomes: Readonly<Record<string, number>>;
  /** The error classes of its `dead_lettered` outcomes. */
  readonly deadLetteredClasses: Readonly<Record<string, number>>;
}

export interface DemoSummary {
  readonly database: "postgres" | "pglite";
  /** What the demo published to the award queue. */
  readonly sent: {
    readonly queue: string;
    /** Award jobs, each with its own job_id: `forCustomers` of open accounts, `forClosedAccount` of a closed one. */
    readonly awardJobs: number;
    readonly forCustomers: number;
    readonly customers: number;
    readonly tenants: number;
    readonly forClosedAccount: number;
    /** Copies of jobs already published (same job_id, a message of their own), as an at-least-once queue delivers them. */
    readonly duplicateCopies: number;
    readonly poison: number;
  };
  /** The partner's failures on purpose: notifications it refuses `refusalsEach` times before it accepts, and ones it never accepts. */
  readonly partner: {
    readonly refusedThenAccepted: number;
    readonly refusalsEach: number;
    readonly neverAccepted: number;
  };
  /** The retry policy's attempts per job. */
  readonly maxAttempts: number;
  /** All deliveries, both consumers. */
  readonly deliveries: number;
  readonly outcomes: Readonly<Record<DeliveryOutcome | "thrown", number>>;
  readonly awardPoints: ConsumerReport;
  readonly notifyPartner: ConsumerReport;
  /** Partner notifications the credits wrote to core.outbox and the relay published (found by their message ids). */
  readonly notificationsRelayed: number;
  /** Ledger rows of this run's award jobs, and how many distinct jobs they are (the difference would be a double credit). */
  readonly creditsApplied: number;
  readonly creditedJobs: number;
  /** Notifications the partner applied (it de-duplicates by idempotency key). */
  readonly partnerNotifications: number;
  /** This run's rows in core.dead_letters, by error class. */
  readonly deadLetters: Readonly<Record<string, number>>;
  readonly deadLetterTotal: number;
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

/** How often the partner refuses each of the notifications it accepts in the end. */
const PARTNER_REFUSALS = 2;

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
  // A business rejection: the customer's account is closed.
  const closedJobs = [
    createEnvelope({
      tenantId: "acme",
      kind: AWARD_POINTS_KIND,
      data: { customerId: CLOSED_CUSTOMER, points: 50, reason: "purchase" },
    }),
  ];
  // At-least-once: the first ten jobs arrive a second time.
  const copies = jobs.slice(0, 10);
  // Poison: not JSON, a negative amount, a job_id that is not UUID v7.
  const poison = [
    "{ this is not json",
    JSON.stringify({
      ...createEnvelope({ tenantId: "acme", kind: AWARD_POINTS_KIND, data: {} }),
      data: { customerId: "c-1", points: -5, reason: "x" },
    }),
    JSON.stringify({ ...jobs[0], job_id: uuidv4() }),
  ];
  const pick = (i: number) => jobs[i]?.job_id ?? "";
  // The partner refuses three notifications twice, then accepts them; it never
  // accepts one (its notification exhausts 5 attempts; the credit stands).
  const failuresByJob = new Map([
    [pick(3), PARTNER_REFUSALS],
    [pick(11), PARTNER_REFUSALS],
    [pick(25), PARTNER_REFUSALS],
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
    for (const job of [...jobs, ...closedJobs]) await module.queue.publish(AWARD_POINTS_QUEUE, job);
    for (const job of copies) await module.queue.publish(AWARD_POINTS_QUEUE, job);
    for (const body of poison) await module.queue.publishRaw(AWARD_POINTS_QUEUE, body);
    // Credits, then the notifications they committed to the outbox.
    await module.settle();

    const expected = new Map<string, number>();
    for (const job of jobs) {
      const key = `${job.tenant_id}/${job.data.customerId}`;
      expected.set(key, (expected.get(key) ?? 0) + job.data.points);
    }
    const after = await readBalances();
    const runJobIds = [...jobs, ...closedJobs].map((j) => j.job_id);
    const ledgerRows = await module.db
      .select({ jobId: ledger.jobId })
      .from(ledger)
      .where(inArray(ledger.jobId, runJobIds));
    const deadLetterIds = events.flatMap((e) => ("deadLetterId" in e.result ? [e.result.deadLetterId] : []));
    const letters = await module.db
      .select({ errorClass: deadLetters.errorClass })
      .from(deadLetters)
      .where(inArray(deadLetters.id, deadLetterIds));
    // The notifications the relay published from core.outbox: the messages notify-partner was handed.
    const notifyMessages = [
      ...new Set(events.filter((e) => e.consumer === module.notifyPartner.name).map((e) => e.messageId)),
    ];
    const [relayed] = await module.db
      .select({ rows: count() })
      .from(outbox)
      .where(and(inArray(outbox.messageId, notifyMessages), isNotNull(outbox.publishedAt)));

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
    for (const event of events) outcomes[event.result.outcome] += 1;
    const report = (consumer: { name: string; queue: string }): ConsumerReport => {
      const mine = events.filter((e) => e.consumer === consumer.name);
      const tally = (keys: string[]) => {
        const counts: Record<string, number> = {};
        for (const key of keys) counts[key] = (counts[key] ?? 0) + 1;
        return counts;
      };
      return {
        name: consumer.name,
        queue: consumer.queue,
        deliveries: mine.length,
        firstDeliveries: mine.filter((e) => e.deliveryCount === 1).length,
        redeliveries: mine.filter((e) => e.deliveryCount > 1).length,
        outcomes: tally(mine.map((e) => e.result.outcome)),
        deadLetteredClasses: tally(
          mine.flatMap((e) => (e.result.outcome === "dead_lettered" ? [e.result.errorClass] : [])),
        ),
      };
    };
    const awardPoints = report(module.awardPoints);
    const notifyPartner = report(module.notifyPartner);
    const deadLetterCounts: Record<string, number> = {};
    for (const { errorClass } of letters) deadLetterCounts[errorClass] = (deadLetterCounts[errorClass] ?? 0) + 1;

    const balanceRows = [...after]
      .map(([key, points]) => {
        const [tenant = "", customer = ""] = key.split("/");
        return { tenant, customer, points: points - (before.get(key) ?? 0), expected: expected.get(key) ?? 0 };
      })
      .filter((b) => b.points !== 0 || b.expected !== 0);
    const credited = new Set(ledgerRows.map((r) => r.jobId));
    const refusals = [...failuresByJob.values()];
    const sent = {
      queue: AWARD_POINTS_QUEUE,
      awardJobs: jobs.length + closedJobs.length,
      forCustomers: jobs.length,
      customers: expected.size,
      tenants: new Set(jobs.map((j) => j.tenant_id)).size,
      forClosedAccount: closedJobs.length,
      duplicateCopies: copies.length,
      poison: poison.length,
    };
    const partnerFailures = {
      refusedThenAccepted: refusals.filter(Number.isFinite).length,
      refusalsEach: PARTNER_REFUSALS,
      neverAccepted: refusals.filter((n) => !Number.isFinite(n)).length,
    };
    // Every credit was told to the partner exactly once, except those it never accepts.
    const notifiedOnce =
      [...partner.appliedByJob].every(([jobId, times]) => times === 1 && credited.has(jobId)) &&
      partner.appliedByJob.size === credited.size - partnerFailures.neverAccepted;
    const deadLetterTotal = letters.length;
    const ok =
      credited.size === ledgerRows.length &&
      notifiedOnce &&
      balanceRows.length === expected.size &&
      balanceRows.every((b) => b.points === b.expected) &&
      // Each message published to the award queue was handed to award-points once;
      // each credit's notification once, and again after each failed attempt.
      awardPoints.deliveries === sent.awardJobs + sent.duplicateCopies + sent.poison &&
      (relayed?.rows ?? 0) === credited.size &&
      notifyPartner.firstDeliveries === credited.size &&
      notifyPartner.redeliveries === outcomes.retry &&
      // One dead letter per dead_lettered or poison outcome: the closed account, the
      // notification the partner never accepts, and the poison payloads.
      deadLetterTotal === outcomes.dead_lettered + outcomes.poison &&
      deadLetterCounts["exhausted"] === partnerFailures.neverAccepted &&
      deadLetterCounts["permanent"] === sent.forClosedAccount &&
      deadLetterCounts["poison"] === sent.poison;
    return {
      database: module.database,
      sent,
      partner: partnerFailures,
      maxAttempts: DEMO_RETRY_POLICY.maxAttempts,
      deliveries: events.length,
      outcomes,
      awardPoints,
      notifyPartner,
      notificationsRelayed: relayed?.rows ?? 0,
      creditsApplied: ledgerRows.length,
      creditedJobs: credited.size,
      partnerNotifications: partner.notified.size,
      deadLetters: deadLetterCounts,
      deadLetterTotal,
      balances: balanceRows,
      ok,
    };
  } finally {
    await module.close();
  }
}

/** The database of your own the demo and the README suggest for a run you can query afterwards. */
export const DEMO_OWN_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/softcrum_dev";

const OUTCOME_ORDER = [
  "success",
  "duplicate",
  "retry",
  "rate_limited",
  "yielded",
  "deferred",
  "skipped",
  "dead_lettered",
  "poison",
  "dead_letter_failed",
  "thrown",
] as const;

/** What each dead letter's class means here. */
const CLASS_MEANING: Readonly<Record<string, string>> = {
  poison: "invalid payloads: dead-lettered at once, never retried",
  permanent: "a business rejection (the closed account): no retry can help",
  exhausted: "failed every attempt (the partner that never accepts); its credit stands",
};

/**
 * The summary `pnpm demo` prints, one string a line: what was sent, what each
 * consumer was handed and did, the dead letters, the money rule, the
 * balances, the verdict, and where to look next. Every number comes from the
 * summary (the deliveries and the database), none is written here.
 */
export function describeDemo(summary: DemoSummary): string[] {
  const lines: string[] = [];
  const line = (label: string, text: string) => lines.push(`${label.padEnd(16)} ${text}`);
  const pad = (text: string | number, width: number) => String(text).padEnd(width);
  const { sent, partner: p, awardPoints: award, notifyPartner: notify } = summary;
  const outcomesOf = (consumer: ConsumerReport, meaning: Readonly<Record<string, string>>) =>
    OUTCOME_ORDER.filter((o) => consumer.outcomes[o])
      .map((o) => {
        const why =
          o === "dead_lettered"
            ? Object.entries(consumer.deadLetteredClasses)
                .map(([c, n]) => (n === consumer.outcomes[o] ? c : `${c} ${n}`))
                .join(", ")
            : meaning[o];
        return `${o} ${consumer.outcomes[o]}${why ? ` (${why})` : ""}`;
      })
      .join(", ");

  lines.push(
    `Softcrum loyalty demo — database: ${summary.database === "pglite" ? "embedded PGlite, gone when the demo ends (set DATABASE_URL for a real Postgres)" : "Postgres from DATABASE_URL"}`,
  );
  lines.push("");
  line(
    "sent",
    `${sent.awardJobs} award jobs to ${sent.queue}: ${sent.forCustomers} for ${sent.customers} customers of ${sent.tenants} tenants, ${sent.forClosedAccount} for a closed account`,
  );
  line(
    "",
    `+ ${sent.duplicateCopies} duplicate copies of the first ${sent.duplicateCopies} (same job_id, as an at-least-once queue delivers a job twice)`,
  );
  line("", `+ ${sent.poison} poison payloads (not JSON, a negative amount, a job_id that is not a UUID v7)`);
  line(
    "partner",
    `fails on purpose: it refuses ${p.refusedThenAccepted} notifications ${p.refusalsEach} times each, then accepts them; never accepts ${p.neverAccepted}`,
  );
  lines.push("");
  line(
    "deliveries",
    `${summary.deliveries} = ${award.deliveries} to ${award.name} + ${notify.deliveries} to ${notify.name} (a delivery: one message handed to one consumer)`,
  );
  line(
    "award-points",
    `${award.deliveries} = ${sent.awardJobs} jobs + ${sent.duplicateCopies} copies + ${sent.poison} poison + ${award.redeliveries} retries (a partner failure never retries a credit)`,
  );
  line("", outcomesOf(award, { success: "credited", duplicate: "copies the fence skipped" }));
  line(
    "notify-partner",
    `${notify.deliveries} = ${notify.firstDeliveries} notifications (one per credit, through core.outbox) + ${notify.redeliveries} retries (${p.refusedThenAccepted} × ${p.refusalsEach} refusals, ${p.neverAccepted} × ${summary.maxAttempts - 1} before giving up at attempt ${summary.maxAttempts})`,
  );
  line("", outcomesOf(notify, { success: "the partner accepted", retry: "it failed: tried again later" }));
  line(
    "dead letters",
    `${summary.deadLetterTotal} in core.dead_letters, one per dead_lettered or poison outcome above (${summary.outcomes.dead_lettered} + ${summary.outcomes.poison}):`,
  );
  const classes = Object.entries(summary.deadLetters).sort(([a], [b]) => classRank(a) - classRank(b));
  const width = Math.max(...classes.map(([c, n]) => `${c} ${n}`.length)) + 2;
  for (const [errorClass, n] of classes)
    line("", `${pad(`${errorClass} ${n}`, width)}${CLASS_MEANING[errorClass] ?? ""}`);
  const matched = summary.balances.filter((b) => b.points === b.expected).length;
  const moneyOk =
    summary.creditsApplied === summary.creditedJobs &&
    matched === summary.balances.length &&
    summary.balances.length === sent.customers;
  line(
    "money rule",
    `${sent.duplicateCopies} duplicate copies → ${summary.creditsApplied - summary.creditedJobs} extra ledger rows (${summary.creditsApplied} rows for ${summary.creditedJobs} credited jobs); ${matched} of ${summary.balances.length} balances as expected ${moneyOk ? "✓" : "✗"}`,
  );
  lines.push("");
  line(
    "balances",
    `${pad("tenant", 8)} ${pad("customer", 10)} ${pad("credited", 9)} ${pad("expected", 10)} (credited: points this run added; expected: the sum of the jobs)`,
  );
  for (const b of summary.balances) {
    line(
      "",
      `${pad(b.tenant, 8)} ${pad(b.customer, 10)} ${pad(b.points, 9)} ${b.expected}${b.points === b.expected ? "" : "  <-- MISMATCH"}`,
    );
  }
  lines.push("");
  lines.push(
    summary.ok
      ? "OK: no job was credited twice, every balance grew by exactly the expected points, and the partner was told of each credit it accepted exactly once."
      : "FAILED: a count above differs from what the scenario did (a balance, a double credit, a delivery or a dead letter too many or too few).",
  );
  lines.push("");
  lines.push("Where to look next:");
  if (summary.database === "pglite") {
    lines.push("  - keep what a run leaves, to query it: run it on a database of your own (README, Database):");
    lines.push("      createdb -h 127.0.0.1 -U postgres softcrum_dev");
    lines.push(`      export DATABASE_URL=${DEMO_OWN_DATABASE_URL}`);
    lines.push("      pnpm db:migrate && pnpm demo");
  } else {
    lines.push("  - what this run wrote stays in that database; each run reports only its own effects");
  }
  lines.push(
    "  - tables: loyalty.ledger, loyalty.balances, core.processed_jobs (the fence), core.outbox, core.dead_letters",
  );
  lines.push(`      psql "$DATABASE_URL" -c 'select consumer, error_class, last_error from core.dead_letters'`);
  lines.push(
    "  - pnpm ops dlq list (with DATABASE_URL): these dead letters; runbooks/dead-letter-replay.md: replay or discard them",
  );
  lines.push(
    '  - README: "Writing a consumer", "Side effects outside the database"; docs/writing-a-module.md: a module of your own',
  );
  return lines;
}

const classRank = (errorClass: string) => {
  const rank = Object.keys(CLASS_MEANING).indexOf(errorClass);
  return rank === -1 ? Number.MAX_SAFE_INTEGER : rank;
};
