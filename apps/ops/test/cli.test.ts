import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { createEnvelope } from "@softcrum/core";
import { createLoyaltyModule } from "@softcrum/example-loyalty/composition-root";
import { runScript, type ScriptResult, useTestDatabase } from "@softcrum/testing";
import { beforeAll, describe, expect, test } from "vitest";

const pg = useTestDatabase("ops-cli");
/** The installed bin (`softcrum-ops`, what `pnpm ops` runs): compiled JS run by plain Node. */
const BIN = fileURLToPath(new URL("../bin/softcrum-ops.mjs", import.meta.url));

/** Runs `pnpm ops …` as an operator would, in its own process, against the test database. */
function ops(args: string[], env: Record<string, string> = {}): Promise<ScriptResult> {
  return runScript(BIN, args, {
    tsx: false,
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    env: { NODE_OPTIONS: "", DATABASE_URL: pg.url, SOFTCRUM_OPERATOR: "", COLUMNS: "200", ...env },
  });
}

/** Two operators, each logging in with their own database role: the CLI's identity (#10 item 4). */
const ANA = "ops_cli_ana";
const BO = "ops_cli_bo";
const as = (role: string) => {
  const u = new URL(pg.url);
  u.username = role;
  u.password = "operator-password";
  return { DATABASE_URL: u.toString() };
};

/** A login role (cluster-wide, so created once whoever runs first) with the operator grants on this database. */
async function operatorRole(
  role: string,
  grants: "operator" | "none" | "read-only" | "operator-not-worker" = "operator",
) {
  await pg.sql
    .unsafe(
      `do $$ begin create role ${role} login password 'operator-password'; exception when others then null; end $$`,
    )
    .catch(() => {});
  if (grants === "none") return;
  // The shipped roles (migration 0018_ops_roles), as the runbook's "Database roles" grants them;
  // with the in-process transport the module's consumers run inside the CLI (softcrum_worker).
  await pg.sql.unsafe(
    grants === "read-only"
      ? `grant softcrum_ops_reader to ${role}`
      : grants === "operator-not-worker"
        ? `grant softcrum_ops_operator to ${role}`
        : `grant softcrum_ops_operator, softcrum_ops_approver, softcrum_worker to ${role}`,
  );
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
  await operatorRole(ANA);
  await operatorRole(BO);
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
  // Cluster-wide role changes and a module run: slow on a loaded 2-core machine, not stuck.
}, 180_000);

describe("pnpm ops, end to end on a real database", () => {
  test("an operator goes from dead letters to a finished, audited replay batch", async () => {
    // 1. Find.
    const listed = await opsJson(["dlq", "list"], as(ANA));
    expect(listed.items).toHaveLength(6);
    const table = await ops(["dlq", "list", "--class", "exhausted"], as(ANA));
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(/^id\s+age\s+consumer/);
    expect(table.stdout).toMatch(/\d+(ms|s) ago/); // ages for people (#10 item 13)
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
    expect((await ops(["dlq", "depth"])).stdout).toMatch(/^queue\s+consumer\s+pending\s+oldest\n[\s\S]*\d+(ms|s)$/m);

    // 2. Understand.
    const poison = listed.items.find((i: { errorClass: string }) => i.errorClass === "poison");
    const shown = await ops(["dlq", "show", poison.id]);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain("{garbage");
    expect(shown.stdout).toMatch(/last error:\s+payload is not JSON/);
    const flaky = listed.items.find((i: { errorClass: string }) => i.errorClass === "exhausted");
    const pretty = await ops(["dlq", "show", flaky.id]);
    // The payload pretty-printed, one field a line (#10 item 13).
    expect(pretty.stdout).toMatch(/payload \(utf8, pretty-printed[^\n]*\n {2}\{\n {4}"/);
    expect(pretty.stdout).toMatch(/lastSeen\s+\d+(ms|s) ago \(\d{4}-/); // an age beside the timestamp

    // 3. Discard what can never succeed (a reason is required).
    const noReason = await ops(["dlq", "discard", poison.id], as(ANA));
    expect(noReason.code).toBe(2);
    expect(noReason.stderr).toMatch(/--reason/);
    const [refusal] = await pg.sql<{ operator: string; action: string; result: string; detail: string }[]>`
      select operator, action, result, detail from core.ops_audit`;
    expect(refusal).toMatchObject({ operator: ANA, action: "cli.dlq.discard", result: "rejected" });
    expect(refusal?.detail).toMatch(/--reason/);
    const discarded = await opsJson(["dlq", "discard", poison.id, "--reason", "producer bug, fixed in v2"], as(ANA));
    expect(discarded.counts).toEqual({ discarded: 1 });

    // 4. A large batch (threshold 1 here) needs a second operator, proven by the database (#10 item 4).
    const env = { SOFTCRUM_OPS_APPROVAL_THRESHOLD: "1" };
    const batch = await opsJson(
      ["batch", "create", "--class", "exhausted", "--reason", "partner back up", "--rate", "20"],
      { ...env, ...as(ANA) },
    );
    expect(batch).toMatchObject({ status: "awaiting_approval", selected: 2, requestedBy: ANA });
    const early = await ops(["batch", "run", batch.id], { ...env, ...as(ANA) });
    expect(early.code).toBe(4);
    expect(early.stderr).toMatch(/awaits approval/);
    const own = await ops(["batch", "approve", batch.id], { ...env, ...as(ANA) });
    expect(own.code).toBe(4);
    expect(own.stderr).toMatch(/cannot approve it/);
    // Ana cannot approve under Bo's name: a typed name is not accepted, a declared one is refused.
    const typed = await ops(["batch", "approve", batch.id, "--operator", BO], { ...env, ...as(ANA) });
    expect(typed.code).toBe(2);
    expect(typed.stderr).toMatch(/--operator is not accepted: the CLI acts as the database role/);
    const declared = await ops(["batch", "approve", batch.id], { ...env, ...as(ANA), SOFTCRUM_OPERATOR: BO });
    expect(declared.code).toBe(2);
    expect(declared.stderr).toMatch(new RegExp(`SOFTCRUM_OPERATOR is "${BO}", but the CLI acts as .*"${ANA}"`));
    expect(await opsJson(["batch", "show", batch.id])).toMatchObject({ status: "awaiting_approval", approvedBy: null });
    expect(await opsJson(["batch", "approve", batch.id], { ...env, ...as(BO) })).toMatchObject({
      status: "ready",
      approvedBy: BO,
    });

    // 5. Run it, with progress on stderr.
    const run = await ops(["batch", "run", batch.id], { ...env, ...as(BO) });
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/replay .*2\/2 \| [\d.]+\/s \| ETA \d+m?s \| failed again 0/);
    expect(run.stdout).toMatch(/status\s+completed/);
    expect(run.stdout).toMatch(/ran\s+\d+(ms|s)/);
    // Its times in human units beside the timestamps, never raw milliseconds (#21 item 8).
    expect(run.stdout).toMatch(/started\s+\d+(ms|s) ago \(\d{4}-\d\d-\d\dT[\d:]+Z\)/);
    expect(run.stdout).toMatch(/ended\s+\d+(ms|s) ago \(/);
    expect(run.stdout).toMatch(/expires\s+in \d+h \d+m \(/);
    expect(run.stdout).toMatch(/lease\s+none/);
    expect(run.stdout).not.toMatch(/\d{4,} ?ms\b/);
    // The credits committed before the outage and stay single; the replayed notifications now went through.
    const credited = await pg.sql<{ job_id: string }[]>`select job_id from loyalty.ledger order by job_id`;
    expect(credited.map((r) => r.job_id)).toEqual([...jobs.flaky].sort());
    const [notified] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.processed_jobs where consumer = 'loyalty.notify-partner'`;
    expect(notified?.n).toBe(2);

    // 6. A sampled batch whose jobs still fail pauses, and its failures are linked to it.
    // --json streams NDJSON: one event a line while it runs, then the result (#10 item 13).
    const closed = await opsJson(
      ["batch", "create", "--class", "permanent", "--reason", "accounts reopened?", "--rate", "50", "--sample", "1"],
      as(ANA),
    );
    const paused = await ops(["batch", "run", closed.id, "--json"], {
      LOYALTY_CLOSED_CUSTOMERS: "c-closed",
      ...as(ANA),
    });
    expect(paused.code).toBe(5);
    const events = paused.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line));
    expect(events.length).toBeGreaterThanOrEqual(2);
    expect(events.slice(0, -1).every((e: { event: string }) => e.event === "progress")).toBe(true);
    expect(events.at(-1)).toMatchObject({ event: "result", batch: { status: "paused", replayed: 1, pending: 2 } });
    const again = await opsJson(["dlq", "failed-after-replay", "--batch", closed.id]);
    expect(again.items).toHaveLength(1);
    expect(again.items[0]).toMatchObject({ batchId: closed.id, errorClass: "permanent", status: "pending_review" });
    const stopped = await opsJson(["batch", "stop", closed.id, "--reason", "accounts stay closed"], as(ANA));
    expect(stopped).toMatchObject({ status: "stopped", stopReason: `stopped by ${ANA}: accounts stay closed` });

    // 7. Everything that changed something is in the audit log, under the database role that did it.
    const audit = await pg.sql<{ operator: string; action: string; result: string }[]>`
      select operator, action, result from core.ops_audit order by at, id`;
    expect(audit).toEqual([
      { operator: ANA, action: "cli.dlq.discard", result: "rejected" }, // no --reason (#10 item 5)
      { operator: ANA, action: "dead_letter.discard", result: "ok" },
      { operator: ANA, action: "batch.create", result: "ok" },
      { operator: ANA, action: "batch.run", result: "rejected" }, // awaiting approval (#10 item 5)
      { operator: ANA, action: "batch.approve", result: "rejected" },
      { operator: ANA, action: "cli.batch.approve", result: "refused" }, // --operator bo
      { operator: ANA, action: "cli.batch.approve", result: "refused" }, // SOFTCRUM_OPERATOR=bo
      { operator: BO, action: "batch.approve", result: "ok" },
      { operator: BO, action: "batch.run", result: "ok" },
      { operator: ANA, action: "batch.create", result: "ok" },
      { operator: ANA, action: "batch.run", result: "ok" },
      { operator: ANA, action: "batch.pause", result: "ok" }, // the sample failed: an audited pause (#10 item 5)
      { operator: ANA, action: "batch.stop", result: "ok" },
    ]);
  });

  test("clear errors and exit codes for bad filters, unknown ids and missing configuration", async () => {
    const badFilter = await ops(["dlq", "list", "--class", "nope"]);
    expect(badFilter).toMatchObject({ code: 2, stderr: expect.stringMatching(/invalid input: --class/) });
    // Errors name the flag the operator typed, never the library's field (#10 item 13).
    const badDate = await ops(["dlq", "count", "--since", "last tuesday"]);
    expect(badDate).toMatchObject({ code: 2, stderr: expect.stringMatching(/--since: must be a date/) });
    expect(badDate.stderr).not.toMatch(/createdAfter/);
    const badLong = await ops(["dlq", "list", "--created-after", "soon"]);
    expect(badLong).toMatchObject({ code: 2, stderr: expect.stringMatching(/--created-after: must be a date/) });
    const order = await ops([
      "dlq",
      "list",
      "--created-after",
      "2026-02-01T00:00:00Z",
      "--created-before",
      "2026-01-01T00:00:00Z",
    ]);
    expect(order.stderr).toMatch(/--created-after must be before --created-before/);
    const badRate = await ops(["batch", "create", "--reason", "r", "--rate", "0"]);
    expect(badRate).toMatchObject({ code: 2, stderr: expect.stringMatching(/--rate: /) });
    expect(badRate.stderr).not.toMatch(/ratePerSecond/);
    const badStrain = await ops(["batch", "create", "--reason", "r", "--rate", "1", "--max-latency-x", "0.5"]);
    expect(badStrain).toMatchObject({ code: 2, stderr: expect.stringMatching(/--max-latency-x: /) });
    const unknown = await ops(["dlq", "show", "01a22958-9425-749c-b1fb-2ee68084ce9f"]);
    expect(unknown).toMatchObject({ code: 3, stderr: expect.stringMatching(/no dead letter/) });
    const notAnId = await ops(["dlq", "show", "42"]);
    expect(notAnId.code).toBe(2);
    const partly = await ops(
      ["dlq", "replay", "01a22958-9425-749c-b1fb-2ee68084ce9f", "--reason", "x", "--json"],
      as(ANA),
    );
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

  test("an in-process replay by a login whose consumers could not write is refused at once: the letter stays pending, the CLI exits (#21 item 4)", async () => {
    const role = "ops_cli_not_worker";
    await operatorRole(role, "operator-not-worker");
    const [letter] = await pg.sql<{ id: string }[]>`
      select id from core.dead_letters where status = 'pending_review' and queue = 'loyalty.points' limit 1`;
    const refused = await ops(["dlq", "replay", letter?.id as string, "--reason", "no worker grants"], as(role));
    expect(refused.code).toBe(1);
    expect(refused.stderr.trim().split("\n")).toHaveLength(1);
    expect(refused.stderr).toMatch(
      /"ops_cli_not_worker" is not a member of softcrum_worker \(with the in-process queue, replays run the module's consumers inside this CLI\): grant softcrum_worker to ops_cli_not_worker/,
    );
    const [after] = await pg.sql<{ status: string }[]>`
      select status from core.dead_letters where id = ${letter?.id as string}`;
    expect(after?.status).toBe("pending_review");
  });

  test("bad ids are bad input before any query, and no error prints SQL or its parameters (#10 item 6)", async () => {
    for (const verb of ["pause", "stop", "resume"]) {
      const result = await ops(["batch", verb, "42", "--reason", "r"], as(ANA));
      expect(result.code, verb).toBe(2);
      expect(result.stderr).toMatch(/must be a batch id \(UUID\)/);
      expect(result.stderr.trim().split("\n")).toHaveLength(1);
      expect(result.stderr).not.toMatch(/Failed query|params:|select |update |invalid input syntax/i);
    }
    for (const args of [
      ["batch", "show", "42"],
      ["batch", "approve", "x"],
      ["batch", "run", "x"],
      ["dlq", "history", "x"],
      ["dlq", "failed-after-replay", "--batch", "x"],
    ]) {
      const result = await ops(args, as(ANA));
      expect(result.code, args.join(" ")).toBe(2);
      expect(result.stderr).not.toMatch(/Failed query|params:|invalid input syntax/i);
    }
    // A query the database refuses (a role that may read but not change): one line naming the
    // cause, without the statement or its parameters.
    const reader = "ops_cli_reader";
    await operatorRole(reader, "read-only");
    const [letter] = await pg.sql<{ id: string }[]>`
      select id from core.dead_letters where status = 'pending_review' limit 1`;
    const refused = await ops(["dlq", "discard", letter?.id as string, "--reason", "secret reason 4411"], as(reader));
    expect(refused.code).toBe(1);
    expect(refused.stderr.trim().split("\n")).toHaveLength(1);
    // Refused before anything changes, naming the role to grant (#21 item 3).
    expect(refused.stderr).toMatch(
      /is not a member of softcrum_ops_operator .*grant softcrum_ops_operator to ops_cli_reader/,
    );
    expect(refused.stderr).not.toMatch(/Failed query|params|update|secret reason|core\.dead_letters" set/i);
    const [after] = await pg.sql<
      { status: string }[]
    >`select status from core.dead_letters where id = ${letter?.id as string}`;
    expect(after?.status).toBe("pending_review");
  });

  test("every list command works without any filter (#10 item 11)", async () => {
    const [letter] = await pg.sql<{ id: string }[]>`select id from core.dead_letters limit 1`;
    for (const args of [
      ["batch", "list"],
      ["dlq", "list"],
      ["dlq", "count"],
      ["dlq", "depth"],
      ["dlq", "failed-after-replay"],
      ["dlq", "history", letter?.id as string],
    ]) {
      const human = await ops(args);
      expect(human.code, `${args.join(" ")}: ${human.stderr}`).toBe(0);
      await opsJson(args);
    }
    expect((await opsJson(["batch", "list"])).items.length).toBeGreaterThanOrEqual(0);
  });

  test("read-only commands never change the database they reach; each unusable database is one line naming the cause, and the process exits (#10 item 12)", async () => {
    const empty = `softcrum_t_ops_cli_empty_${process.pid}`;
    await pg.sql.unsafe(`drop database if exists ${empty}`);
    await pg.sql.unsafe(`create database ${empty}`);
    const nobody = "ops_cli_nobody";
    await operatorRole(nobody, "none");
    const url = (database: string, port?: string) => {
      const u = new URL(pg.url);
      u.pathname = `/${database}`;
      if (port) u.port = port;
      return u.toString();
    };
    try {
      const cases: [string, Record<string, string>, RegExp][] = [
        [
          "a fresh empty database",
          { DATABASE_URL: url(empty) },
          new RegExp(`database "${empty}" .*has no Softcrum tables .*core.dead_letters.* missing.*pnpm db:migrate`),
        ],
        [
          "a refused connection",
          { DATABASE_URL: url(pg.name, "1") },
          /cannot connect to Postgres at .*:1: connection refused/,
        ],
        [
          "a database that does not exist",
          { DATABASE_URL: url(`${pg.name}_nope`) },
          new RegExp(`database "${pg.name}_nope" does not exist`),
        ],
        [
          "a role without privileges",
          as(nobody),
          new RegExp(
            `role "${nobody}" (may not read core.dead_letters|lacks a privilege .*permission denied for schema core)`,
          ),
        ],
      ];
      for (const [name, env, cause] of cases) {
        for (const args of [
          ["dlq", "count"],
          ["dlq", "list"],
          ["batch", "list"],
          ["dlq", "depth"],
        ]) {
          const result = await ops(args, env);
          expect(result.code, `${name}: ${args.join(" ")}`).toBe(1);
          const lines = result.stderr.trim().split("\n");
          expect(lines, name).toHaveLength(1);
          expect(lines[0], name).toMatch(/^error: /);
          expect(lines[0], name).toMatch(cause);
          expect(result.stderr, name).not.toMatch(/CREATE SCHEMA|Failed query|at .*\.(ts|mjs):\d+/);
        }
      }
      // Nothing was created in the empty database: no schema, no table.
      const other = new URL(pg.url);
      other.pathname = `/${empty}`;
      const { default: postgres } = await import("postgres");
      const sql = postgres(other.toString(), { max: 1, onnotice: () => {} });
      try {
        const schemas = await sql<{ nspname: string }[]>`
          select nspname from pg_namespace where nspname in ('core', 'drizzle', 'loyalty')`;
        expect(schemas).toEqual([]);
      } finally {
        await sql.end();
      }
    } finally {
      await pg.sql.unsafe(`drop database if exists ${empty} with (force)`);
    }
  });

  test("tables fit the terminal, cut with …; --wide prints every cell whole (#10 item 13)", async () => {
    const narrow = await ops(["dlq", "list", "--all"], { COLUMNS: "80" });
    expect(narrow.code).toBe(0);
    const lines = narrow.stdout.trimEnd().split("\n");
    for (const line of lines) expect(line.length, line).toBeLessThanOrEqual(80);
    expect(narrow.stdout).toContain("…");
    const wide = await ops(["dlq", "list", "--all", "--wide"], { COLUMNS: "80" });
    expect(wide.stdout.split("\n").some((line) => line.length > 80)).toBe(true);
    expect(wide.stdout).not.toContain("…");
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
    expect(human.stdout).toMatch(/^id\s+age\s+batchId[^\n]*\n[^\n]*\n[0-9a-f-]{36}\s+\d+(ms|s|m)( \d+s)? ago /);

    const [letter] = await pg.sql<{ id: string }[]>`select id from core.dead_letters where job_id = 'paging-1' limit 1`;
    for (const reason of ["first look", "second look"]) {
      await ops(["dlq", "discard", letter?.id as string, "--reason", reason], as(ANA));
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
    const tooShort = await ops(["audit", "prune", "--retention-days", "7"], as(ANA));
    expect(tooShort).toMatchObject({
      code: 2,
      stderr: expect.stringMatching(/--retention-days: must be at least 30 days/),
    });
    const dry = await ops(["audit", "prune", "--dry-run"], as(ANA));
    expect(dry.stdout).toMatch(/dry run: would delete 1 audit entries older than .* \(400 days\)/);
    const pruned = await opsJson(["audit", "prune", "--retention-days", "30"], as(ANA));
    expect(pruned).toMatchObject({ deleted: 1, dryRun: false });
    const left = await pg.sql<
      { operator: string }[]
    >`select operator from core.ops_audit where operator in ('old', 'recent')`;
    expect(left).toEqual([{ operator: "recent" }]);
  });

  test("--rate 10% paces a batch at a share of live traffic between --rate-floor and --rate-ceiling (#21 item 5)", async () => {
    const envelope = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "c-share", points: 1, reason: "x" },
    });
    const letterId = randomUUID();
    await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${letterId}, ${envelope.job_id}, 'loyalty.points', 'loyalty.award-points', ${JSON.stringify(envelope)}, 5, 'e', 'expired')`;
    const shared = await opsJson(
      ["batch", "create", "--class", "expired", "--reason", "paced by live", "--rate", "10%", "--rate-floor", "0.5"],
      as(ANA),
    );
    expect(shared).toMatchObject({ rateShare: 0.1, rateFloor: 0.5, ratePerSecond: 50 });
    const bad = await ops(
      ["batch", "create", "--class", "expired", "--reason", "x", "--rate", "10%", "--rate-floor", "60"],
      as(ANA),
    );
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--rate-floor/);
    await ops(["batch", "stop", shared.id, "--reason", "test over"], as(ANA));
  });

  test("the sample's outcomes are shown beside the selection's classes; without a terminal to ask on, the batch pauses for review (#21 item 7)", async () => {
    for (let i = 0; i < 3; i++) {
      const envelope = createEnvelope({
        tenantId: "sampled",
        kind: "points.award.v1",
        data: { customerId: `c-sample-${i}`, points: 1, reason: "x" },
      });
      await pg.sql`insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
        values (${randomUUID()}, ${envelope.job_id}, 'sampled', 'loyalty.points', 'loyalty.award-points', ${JSON.stringify(envelope)}, 5, 'partner down', 'exhausted')`;
    }
    const sampled = await opsJson(
      ["batch", "create", "--tenant", "sampled", "--reason", "sampled", "--rate", "50", "--sample", "1"],
      as(ANA),
    );
    const review = await ops(["batch", "run", sampled.id], as(ANA));
    expect(review.code, review.stderr).toBe(5);
    expect(review.stdout).toMatch(/sample: 1 replayed, every outcome in/);
    expect(review.stdout).toMatch(/\bexhausted\s+succeeded\s+partner down/);
    expect(review.stdout).toMatch(/selection by error class: exhausted 3; 2 letters left after the sample/);
    expect(review.stdout).toMatch(/paused for review/);
    expect(review.stdout).toMatch(/status\s+paused/);
    // Resuming accepts the sample; the rest runs without asking again.
    await opsJson(["batch", "resume", sampled.id, "--reason", "sample looks right"], as(ANA));
    const done = await ops(["batch", "run", sampled.id, "--json"], as(ANA));
    expect(done.code, done.stderr).toBe(0);
    const events = done.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { event: string });
    expect(events.map((e) => e.event)).not.toContain("sample");
    expect(events.at(-1)).toMatchObject({ event: "result", batch: { status: "completed", replayed: 3, succeeded: 3 } });
  });
});
