import { fileURLToPath } from "node:url";
import { createEnvelope } from "@softcrum/core";
import { createLoyaltyModule } from "@softcrum/example-loyalty/composition-root";
import { runScript, useTestDatabase } from "@softcrum/testing";
import { beforeAll, describe, expect, test } from "vitest";

const pg = useTestDatabase("ops-cli");
const CLI = fileURLToPath(new URL("../src/cli.ts", import.meta.url));

/** Runs `pnpm ops …` as an operator would, in its own process, against the test database. */
function ops(args: string[], env: Record<string, string> = {}) {
  return runScript(CLI, args, {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    env: { DATABASE_URL: pg.url, SOFTCRUM_OPERATOR: "", ...env },
  });
}
const opsJson = async (args: string[], env: Record<string, string> = {}) => {
  const result = await ops([...args, "--json"], env);
  expect(result.code, result.stderr).toBe(0);
  return JSON.parse(result.stdout);
};

const jobs = {
  closed: [] as string[],
  flaky: [] as string[],
};

beforeAll(async () => {
  // A module run that leaves dead letters behind: a partner outage (exhausted
  // notifications of committed credits), closed accounts (permanent) and one poison payload.
  const down = new Set<string>();
  const module = await createLoyaltyModule({
    databaseUrl: pg.url,
    transport: "memory",
    notifier: {
      async pointsAwarded({ jobId }) {
        if (down.has(jobId)) throw new Error("partner statement service unavailable");
      },
    },
    closedCustomers: new Set(["c-closed"]),
    retry: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 10 },
    logger: { warn: () => {}, error: () => {} },
  });
  for (let i = 0; i < 2; i++) {
    const e = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: `c-${i}`, points: 10 + i, reason: "purchase" },
    });
    down.add(e.job_id);
    jobs.flaky.push(e.job_id);
    await module.queue.publish("loyalty.points", e);
  }
  for (let i = 0; i < 3; i++) {
    const e = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "c-closed", points: 5, reason: "purchase" },
    });
    jobs.closed.push(e.job_id);
    await module.queue.publish("loyalty.points", e);
  }
  await module.queue.publishRaw("loyalty.points", "{garbage");
  if (module.transport === "memory") await module.settle();
  await module.close();
});

describe("pnpm ops, end to end on a real database", () => {
  test("an operator goes from dead letters to a finished, audited replay batch", async () => {
    // 1. Find.
    const listed = await opsJson(["dlq", "list"]);
    expect(listed.items).toHaveLength(6);
    const table = await ops(["dlq", "list", "--class", "exhausted"]);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(/^id\s+createdAt\s+queue/);
    expect(table.stdout.match(/exhausted/g)).toHaveLength(2);
    expect((await opsJson(["dlq", "depth"])).items).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ queue: "loyalty.points", consumer: "loyalty.award-points", pending: 4 }),
        expect.objectContaining({
          queue: "loyalty.partner-notifications",
          consumer: "loyalty.notify-partner",
          pending: 2,
        }),
      ]),
    );

    // 2. Understand.
    const poison = listed.items.find((i: { errorClass: string }) => i.errorClass === "poison");
    const shown = await ops(["dlq", "show", poison.id]);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain("{garbage");
    expect(shown.stdout).toMatch(/last error:\s+payload is not JSON/);

    // 3. Discard what can never succeed (a reason is required).
    const noReason = await ops(["dlq", "discard", poison.id, "--operator", "ana"]);
    expect(noReason.code).toBe(2);
    expect(noReason.stderr).toMatch(/--reason/);
    const noOperator = await ops(["dlq", "discard", poison.id, "--reason", "producer bug"]);
    expect(noOperator.code).toBe(2);
    expect(noOperator.stderr).toMatch(/pass --operator NAME or set SOFTCRUM_OPERATOR/);
    const discarded = await opsJson([
      "dlq",
      "discard",
      poison.id,
      "--reason",
      "producer bug, fixed in v2",
      "--operator",
      "ana",
    ]);
    expect(discarded.counts).toEqual({ discarded: 1 });

    // 4. A large batch (threshold 1 here) needs a second operator.
    const env = { SOFTCRUM_OPS_APPROVAL_THRESHOLD: "1" };
    const batch = await opsJson(
      ["batch", "create", "--class", "exhausted", "--reason", "partner back up", "--rate", "20", "--operator", "ana"],
      env,
    );
    expect(batch).toMatchObject({ status: "awaiting_approval", selected: 2, requestedBy: "ana" });
    const early = await ops(["batch", "run", batch.id, "--operator", "ana"], env);
    expect(early.code).toBe(4);
    expect(early.stderr).toMatch(/awaits approval/);
    const own = await ops(["batch", "approve", batch.id, "--operator", "ana"], env);
    expect(own.code).toBe(4);
    expect(own.stderr).toMatch(/cannot approve it/);
    expect(await opsJson(["batch", "approve", batch.id, "--operator", "bo"], env)).toMatchObject({
      status: "ready",
      approvedBy: "bo",
    });

    // 5. Run it, with progress on stderr.
    const run = await ops(["batch", "run", batch.id, "--operator", "bo"], env);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/replay .*2\/2 \| [\d.]+\/s \| ETA \d+s \| failed again 0/);
    expect(run.stdout).toMatch(/status\s+completed/);
    // The credits committed before the outage and stay single; the replayed notifications now went through.
    const credited = await pg.sql<{ job_id: string }[]>`select job_id from loyalty.ledger order by job_id`;
    expect(credited.map((r) => r.job_id)).toEqual([...jobs.flaky].sort());
    const [notified] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.processed_jobs where consumer = 'loyalty.notify-partner'`;
    expect(notified?.n).toBe(2);

    // 6. A sampled batch whose jobs still fail pauses, and its failures are linked to it.
    const closed = await opsJson([
      "batch",
      "create",
      "--class",
      "permanent",
      "--reason",
      "accounts reopened?",
      "--rate",
      "50",
      "--sample",
      "1",
      "--operator",
      "ana",
    ]);
    const paused = await ops(["batch", "run", closed.id, "--operator", "ana", "--json"], {
      LOYALTY_CLOSED_CUSTOMERS: "c-closed",
    });
    expect(paused.code).toBe(5);
    expect(JSON.parse(paused.stdout)).toMatchObject({ status: "paused", replayed: 1, pending: 2 });
    const again = await opsJson(["dlq", "failed-after-replay", "--batch", closed.id]);
    expect(again.items).toHaveLength(1);
    expect(again.items[0]).toMatchObject({ batchId: closed.id, errorClass: "permanent", status: "pending_review" });
    const stopped = await opsJson([
      "batch",
      "stop",
      closed.id,
      "--reason",
      "accounts stay closed",
      "--operator",
      "ana",
    ]);
    expect(stopped).toMatchObject({ status: "stopped", stopReason: "stopped by ana: accounts stay closed" });

    // 7. Everything that changed something is in the audit log.
    const audit = await pg.sql<{ operator: string; action: string; result: string }[]>`
      select operator, action, result from core.ops_audit order by at, id`;
    expect(audit).toEqual([
      { operator: "ana", action: "dead_letter.discard", result: "ok" },
      { operator: "ana", action: "batch.create", result: "ok" },
      { operator: "ana", action: "batch.run", result: "refused" }, // awaiting approval (#10 item 5)
      { operator: "ana", action: "batch.approve", result: "rejected" },
      { operator: "bo", action: "batch.approve", result: "ok" },
      { operator: "bo", action: "batch.run", result: "ok" },
      { operator: "ana", action: "batch.create", result: "ok" },
      { operator: "ana", action: "batch.run", result: "ok" },
      { operator: "ana", action: "batch.pause", result: "ok" }, // the sample failed: an audited pause (#10 item 5)
      { operator: "ana", action: "batch.stop", result: "ok" },
    ]);
  });

  test("clear errors and exit codes for bad filters, unknown ids and missing configuration", async () => {
    const badFilter = await ops(["dlq", "list", "--class", "nope"]);
    expect(badFilter).toMatchObject({ code: 2, stderr: expect.stringMatching(/invalid filter: errorClass/) });
    const badDate = await ops(["dlq", "count", "--since", "last tuesday"]);
    expect(badDate).toMatchObject({ code: 2, stderr: expect.stringMatching(/createdAfter: must be a date/) });
    const unknown = await ops(["dlq", "show", "01a22958-9425-749c-b1fb-2ee68084ce9f"]);
    expect(unknown).toMatchObject({ code: 3, stderr: expect.stringMatching(/no dead letter/) });
    const notAnId = await ops(["dlq", "show", "42"]);
    expect(notAnId.code).toBe(2);
    const partly = await ops([
      "dlq",
      "replay",
      "01a22958-9425-749c-b1fb-2ee68084ce9f",
      "--reason",
      "x",
      "--operator",
      "ana",
      "--json",
    ]);
    expect(partly.code).toBe(3); // none of the ids exists
    expect(JSON.parse(partly.stdout).counts).toEqual({ not_found: 1 });
    const badStatus = await ops(["batch", "list", "--status", "bogus"]);
    expect(badStatus.code).toBe(2);
    const all = await opsJson(["dlq", "count", "--all"]);
    const pending = await opsJson(["dlq", "count"]);
    expect(all.count).toBeGreaterThan(pending.count);
    const unknownCommand = await ops(["dlq", "explode"]);
    expect(unknownCommand.code).toBe(2);
    const noDatabase = await ops(["dlq", "list"], { DATABASE_URL: "" });
    expect(noDatabase).toMatchObject({ code: 2, stderr: expect.stringMatching(/DATABASE_URL is not set/) });
  });

  test("failed-after-replay and history page with --limit and --cursor; audit prune keeps its retention (#9 item 13)", async () => {
    // Three replayed letters of one consumer, each failed again.
    await pg.sql`
      with replayed as (
        insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
                                       created_at, status_changed_at, status_changed_by, status_reason)
        select gen_random_uuid(), 'paging-' || i, 'q', 'paging.c', '{}', 5, 'e', 'exhausted', 'replayed',
               now() - interval '2 days', now() - interval '1 day', 'ana', 'r'
        from generate_series(1, 3) i
        returning job_id)
      insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      select gen_random_uuid(), job_id, 'q', 'paging.c', '{}', 5, 'e', 'exhausted' from replayed`;
    const all = await opsJson(["dlq", "failed-after-replay", "--limit", "500"]);
    expect(all.nextCursor).toBeNull();
    const paged: string[] = [];
    let cursor: string | null = null;
    do {
      const page = await opsJson([
        "dlq",
        "failed-after-replay",
        "--limit",
        "1",
        ...(cursor ? ["--cursor", cursor] : []),
      ]);
      expect(page.items.length).toBeLessThanOrEqual(1);
      paged.push(...page.items.map((l: { id: string }) => l.id));
      cursor = page.nextCursor;
    } while (cursor);
    expect(paged).toEqual(all.items.map((l: { id: string }) => l.id));
    expect(paged.length).toBeGreaterThanOrEqual(3);
    const human = await ops(["dlq", "failed-after-replay", "--limit", "1"]);
    expect(human.stdout).toMatch(/more: --cursor [0-9a-f-]{36}\.[0-9a-f-]{36}/);

    const [letter] = await pg.sql<{ id: string }[]>`select id from core.dead_letters where job_id = 'paging-1' limit 1`;
    for (const reason of ["first look", "second look"]) {
      await ops(["dlq", "discard", letter?.id as string, "--reason", reason, "--operator", "ana"]);
    }
    const history = await opsJson(["dlq", "history", letter?.id as string, "--limit", "1"]);
    expect(history.items).toHaveLength(1);
    expect(history.nextCursor).toEqual(expect.any(String));
    const rest = await opsJson(["dlq", "history", letter?.id as string, "--cursor", history.nextCursor]);
    expect(rest.items).toHaveLength(1);

    await pg.sql`
      insert into core.ops_audit (id, at, operator, action, scope, result)
      values (gen_random_uuid(), now() - interval '500 days', 'old', 'dead_letter.discard', '{}', 'ok'),
             (gen_random_uuid(), now() - interval '20 days', 'recent', 'dead_letter.discard', '{}', 'ok')`;
    const tooShort = await ops(["audit", "prune", "--retention-days", "7", "--operator", "ana"]);
    expect(tooShort).toMatchObject({ code: 2, stderr: expect.stringMatching(/at least 30 days/) });
    const dry = await ops(["audit", "prune", "--dry-run", "--operator", "ana"]);
    expect(dry.stdout).toMatch(/dry run: would delete 1 audit entries older than .* \(400 days\)/);
    const pruned = await opsJson(["audit", "prune", "--retention-days", "30", "--operator", "ana"]);
    expect(pruned).toMatchObject({ deleted: 1, dryRun: false });
    const left = await pg.sql<
      { operator: string }[]
    >`select operator from core.ops_audit where operator in ('old', 'recent')`;
    expect(left).toEqual([{ operator: "recent" }]);
  });
});
