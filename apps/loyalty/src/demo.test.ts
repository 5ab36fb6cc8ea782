import { useModuleDatabase } from "@softcrum/core/testing";
import { describe, expect, test } from "vitest";
import { DEMO_RETRY_POLICY, type DemoSummary, describeDemo, runDemo } from "./demo-scenario.ts";

const pg = useModuleDatabase("loyalty-demo");

/**
 * What the scenario does, counted by hand: 40 award jobs for 5 customers of
 * each of 2 tenants and 1 for a closed account, the first 10 published twice,
 * 3 poison payloads; the partner refuses 3 notifications twice each and
 * never accepts 1 (5 attempts).
 */
const SCENARIO = {
  jobs: 41,
  open: 40,
  customers: 10,
  tenants: 2,
  closed: 1,
  copies: 10,
  poison: 3,
  refusedThenAccepted: 3,
  refusalsEach: 2,
  neverAccepted: 1,
} as const;
const S = SCENARIO;
/** Partner retries: each refusal of an accepted notification, and every attempt but the last of the one never accepted. */
const RETRIES = S.refusedThenAccepted * S.refusalsEach + S.neverAccepted * (DEMO_RETRY_POLICY.maxAttempts - 1);

/** The numbers `pnpm demo` prints, each checked against what the scenario did. */
function expectTheNumbers(summary: DemoSummary) {
  expect(summary.sent).toEqual({
    queue: "loyalty.points",
    awardJobs: S.jobs,
    forCustomers: S.open,
    customers: S.customers,
    tenants: S.tenants,
    forClosedAccount: S.closed,
    duplicateCopies: S.copies,
    poison: S.poison,
  });
  expect(summary.partner).toEqual({
    refusedThenAccepted: S.refusedThenAccepted,
    refusalsEach: S.refusalsEach,
    neverAccepted: S.neverAccepted,
  });
  // Award jobs: every message (job, copy, poison) handed over once; the partner's
  // failures retry or dead-letter its notifications, never the credits (#9 item 3).
  expect(summary.awardPoints).toEqual({
    name: "loyalty.award-points",
    queue: "loyalty.points",
    deliveries: S.jobs + S.copies + S.poison,
    firstDeliveries: S.jobs + S.copies + S.poison,
    redeliveries: 0,
    outcomes: { success: S.open, duplicate: S.copies, dead_lettered: S.closed, poison: S.poison },
    deadLetteredClasses: { permanent: S.closed },
  });
  // One notification per credit, through the outbox, plus the retries of the partner's failures.
  expect(RETRIES).toBe(10);
  expect(summary.notifyPartner).toEqual({
    name: "loyalty.notify-partner",
    queue: "loyalty.partner-notifications",
    deliveries: S.open + RETRIES,
    firstDeliveries: S.open,
    redeliveries: RETRIES,
    outcomes: { success: S.open - S.neverAccepted, retry: RETRIES, dead_lettered: S.neverAccepted },
    deadLetteredClasses: { exhausted: S.neverAccepted },
  });
  expect(summary.deliveries).toBe(summary.awardPoints.deliveries + summary.notifyPartner.deliveries);
  expect(summary.deliveries).toBe(104);
  expect(summary.outcomes).toMatchObject({
    success: 2 * S.open - S.neverAccepted,
    duplicate: S.copies,
    retry: RETRIES,
    dead_lettered: S.closed + S.neverAccepted,
    poison: S.poison,
    thrown: 0,
  });
  expect(summary.notificationsRelayed).toBe(S.open);
  expect(summary.creditsApplied).toBe(S.open);
  expect(summary.creditedJobs).toBe(S.open);
  expect(summary.partnerNotifications).toBe(S.open - S.neverAccepted);
  // One count of dead letters: one per dead_lettered or poison outcome, by class.
  expect(summary.deadLetters).toEqual({ poison: S.poison, permanent: S.closed, exhausted: S.neverAccepted });
  expect(summary.deadLetterTotal).toBe(summary.outcomes.dead_lettered + summary.outcomes.poison);
  expect(summary.deadLetterTotal).toBe(5);
  expect(summary.balances).toHaveLength(S.customers);
  expect(summary.balances.every((b) => b.points === b.expected)).toBe(true);
  expect(summary.ok).toBe(true);
}

/** The lines `pnpm demo` prints, each with the numbers above. */
function expectTheLines(lines: string[]) {
  const expected = [
    "sent             41 award jobs to loyalty.points: 40 for 10 customers of 2 tenants, 1 for a closed account",
    "                 + 10 duplicate copies of the first 10 (same job_id, as an at-least-once queue delivers a job twice)",
    "                 + 3 poison payloads (not JSON, a negative amount, a job_id that is not a UUID v7)",
    "partner          fails on purpose: it refuses 3 notifications 2 times each, then accepts them; never accepts 1",
    "deliveries       104 = 54 to loyalty.award-points + 50 to loyalty.notify-partner (a delivery: one message handed to one consumer)",
    "award-points     54 = 41 jobs + 10 copies + 3 poison + 0 retries (a partner failure never retries a credit)",
    "                 success 40 (credited), duplicate 10 (copies the fence skipped), dead_lettered 1 (permanent), poison 3",
    "notify-partner   50 = 40 notifications (one per credit, through core.outbox) + 10 retries (3 × 2 refusals, 1 × 4 before giving up at attempt 5)",
    "                 success 39 (the partner accepted), retry 10 (it failed: tried again later), dead_lettered 1 (exhausted)",
    "dead letters     5 in core.dead_letters, one per dead_lettered or poison outcome above (2 + 3):",
    "                 poison 3     invalid payloads: dead-lettered at once, never retried",
    "                 permanent 1  a business rejection (the closed account): no retry can help",
    "                 exhausted 1  failed every attempt (the partner that never accepts); its credit stands",
    "money rule       10 duplicate copies → 0 extra ledger rows (40 rows for 40 credited jobs); 10 of 10 balances as expected ✓",
  ];
  // In this order, one after the other (blank lines aside).
  const printed = lines.filter((l) => l !== "");
  const at = printed.indexOf(expected[0] as string);
  expect(printed.slice(at, at + expected.length)).toEqual(expected);
  // The balances: one line per customer, credited = expected.
  const balances = lines.filter((l) => /^ {17}(acme|globex) /.test(l));
  expect(balances).toHaveLength(S.customers);
  for (const l of balances) expect(l).toMatch(/^ {17}\w+ +c-\d +(\d+) +\1$/);
  expect(lines).toContain(
    "OK: no job was credited twice, every balance grew by exactly the expected points, and the partner was told of each credit it accepted exactly once.",
  );
  // Where to look next: the tables, the CLI, the docs.
  const next = lines.slice(lines.indexOf("Where to look next:")).join("\n");
  for (const pointer of [
    "loyalty.ledger",
    "loyalty.balances",
    "core.processed_jobs",
    "core.outbox",
    "core.dead_letters",
    "pnpm ops dlq list",
    "runbooks/dead-letter-replay.md",
    "docs/writing-a-module.md",
    "README",
  ]) {
    expect(next).toContain(pointer);
  }
}

/** The lines from "sent" to the verdict: the same whatever the database. */
const middle = (lines: string[]) =>
  lines.slice(
    lines.findIndex((l) => l.startsWith("sent ")),
    lines.findIndex((l) => l.startsWith("OK:")),
  );

describe("the loyalty demo", () => {
  let first: string[] = [];

  test("on real Postgres: duplicates are skipped, retries apply once, failures are dead-lettered, balances match", async () => {
    const summary = await runDemo({ databaseUrl: pg.url });
    expect(summary.database).toBe("postgres");
    expectTheNumbers(summary);
    first = describeDemo(summary);
    expectTheLines(first);
    expect(first[0]).toBe("Softcrum loyalty demo — database: Postgres from DATABASE_URL");

    // The same numbers, in the tables the summary points to.
    const [ledger] = await pg.sql<{ rows: number; jobs: number }[]>`
      select count(*)::int as rows, count(distinct job_id)::int as jobs from loyalty.ledger`;
    expect(ledger).toEqual({ rows: S.open, jobs: S.open });
    // Every credit wrote one notification to the outbox, and each was published.
    const [outbox] = await pg.sql<{ rows: number; published: number }[]>`
      select count(*)::int as rows, count(published_at)::int as published from core.outbox`;
    expect(outbox).toEqual({ rows: S.open, published: S.open });
    const fences = await pg.sql<{ consumer: string; n: number }[]>`
      select consumer, count(*)::int as n from core.processed_jobs group by consumer order by consumer`;
    expect(fences).toEqual([
      { consumer: "loyalty.award-points", n: S.open },
      { consumer: "loyalty.notify-partner", n: S.open - S.neverAccepted },
    ]);
    const letters = await pg.sql<{ error_class: string; n: number }[]>`
      select error_class, count(*)::int as n from core.dead_letters where status = 'pending_review'
       group by error_class order by error_class`;
    expect(letters).toEqual([
      { error_class: "exhausted", n: S.neverAccepted },
      { error_class: "permanent", n: S.closed },
      { error_class: "poison", n: S.poison },
    ]);
  });

  test("a second run on the same database reports only its own effects: the same lines", async () => {
    const summary = await runDemo({ databaseUrl: pg.url });
    expectTheNumbers(summary);
    expect(describeDemo(summary)).toEqual(first);
  });

  test("with no database configured it runs on the embedded PGlite, with the same lines", async () => {
    const summary = await runDemo({ databaseUrl: null });
    expect(summary.database).toBe("pglite");
    expectTheNumbers(summary);
    const lines = describeDemo(summary);
    expectTheLines(lines);
    expect(middle(lines)).toEqual(middle(first));
    expect(lines[0]).toContain("embedded PGlite");
    // It says how to keep a run to query: a database of your own, never the system database.
    expect(lines).toContain("      createdb -h 127.0.0.1 -U postgres softcrum_dev");
    expect(lines).toContain("      export DATABASE_URL=postgres://postgres@127.0.0.1:5432/softcrum_dev");
  });
});
