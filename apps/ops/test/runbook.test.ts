import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { runScript, type ScriptResult, useTestDatabase } from "@softcrum/testing";
import postgres from "postgres";
import { beforeAll, describe, expect, test } from "vitest";

/**
 * The runbook works verbatim (#10 item 14): on the data `pnpm demo` leaves,
 * every `pnpm ops` command of runbooks/dead-letter-replay.md runs as written
 * (placeholders replaced by the ids the runbook says to take) and succeeds,
 * and so does every SQL query it shows.
 */
const pg = useTestDatabase("ops-runbook");
const BIN = fileURLToPath(new URL("../bin/softcrum-ops.mjs", import.meta.url));
const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const RUNBOOK = readFileSync(
  fileURLToPath(new URL("../../../runbooks/dead-letter-replay.md", import.meta.url)),
  "utf8",
);
const ANA = "ops_runbook_ana";
const BO = "ops_runbook_bo";
const CARLA = "ops_runbook_carla";

const urlAs = (role: string) => {
  const u = new URL(pg.url);
  u.username = role;
  u.password = "operator-password";
  return u.toString();
};

/**
 * The runbook's "Database roles" block, run as written with this test's
 * login names: the shipped roles are all the grants an operator gets. Login
 * roles are cluster-wide, so one made by an earlier run is granted the same
 * roles instead.
 */
async function runbookRoles() {
  const block = blocks("sql").find((q) => /create role/i.test(q)) as string;
  const names: Record<string, string> = { ana: ANA, bo: BO, carla: CARLA };
  const statements = block
    .split(";")
    .map((s) => s.replace(/--[^\n]*/g, "").trim())
    .filter(Boolean)
    .map((s) => s.replace(/\b(ana|bo|carla)\b/g, (n) => names[n] as string).replace("'…'", "'operator-password'"));
  for (const statement of statements) {
    await pg.sql.unsafe(statement).catch(async (error: { code?: string }) => {
      const made = /^create role (\w+) .* in role (.+)$/i.exec(statement);
      if (error.code !== "42710" || !made) throw error;
      await pg.sql.unsafe(`grant ${made[2]} to ${made[1]}`);
    });
  }
}

function run(args: string[], env: Record<string, string>): Promise<ScriptResult> {
  return runScript(BIN, args, { tsx: false, cwd: ROOT, env: { NODE_OPTIONS: "", SOFTCRUM_OPERATOR: "", ...env } });
}

/** Shell words of one command line: quotes, and a `#` comment outside them. */
function words(line: string): string[] {
  const out: string[] = [];
  let word: string | null = null;
  let quote: string | null = null;
  for (const ch of line) {
    if (quote) {
      if (ch === quote) quote = null;
      else word += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      word ??= "";
    } else if (/\s/.test(ch)) {
      if (word !== null) out.push(word);
      word = null;
    } else if (ch === "#" && word === null) break;
    else word = (word ?? "") + ch;
  }
  if (word !== null) out.push(word);
  return out;
}

/** The runbook's code blocks of one language, continuation lines joined. */
function blocks(language: string): string[] {
  return [...RUNBOOK.matchAll(new RegExp(`\`\`\`${language}\\n([\\s\\S]*?)\`\`\``, "g"))].map((m) =>
    (m[1] as string).replace(/\\\n\s*/g, ""),
  );
}

interface Step {
  readonly line: string;
  readonly env: Record<string, string>;
  readonly args: string[];
}

/** Every `pnpm ops` command the runbook shows, with its leading VAR=value assignments. */
function runbookCommands(): Step[] {
  const steps: Step[] = [];
  for (const block of blocks("sh")) {
    for (const line of block.split("\n")) {
      const w = words(line);
      const env: Record<string, string> = {};
      while (w[0] && /^[A-Z_]+=/.test(w[0])) {
        const [name, ...value] = (w.shift() as string).split("=");
        env[name as string] = value.join("=");
      }
      if (w[0] === "pnpm" && w[1] === "ops") steps.push({ line: line.trim(), env, args: w.slice(2) });
    }
  }
  return steps;
}

beforeAll(async () => {
  await runbookRoles();
  // `pnpm demo` against this (migrated) database: the data the runbook is written for.
  const demo = await runScript(fileURLToPath(new URL("../../loyalty/src/demo.ts", import.meta.url)), [], {
    cwd: ROOT,
    env: { DATABASE_URL: pg.url },
  });
  expect(demo.code, demo.stderr).toBe(0);
  // Cluster-wide role changes and a demo process: slow on a loaded 2-core machine, not stuck.
}, 180_000);

describe("runbooks/dead-letter-replay.md works verbatim on the demo data (#10 item 14)", () => {
  test("every pnpm ops command it shows runs as written and succeeds", async () => {
    const steps = runbookCommands();
    expect(steps.length).toBeGreaterThanOrEqual(25);
    // Rehearsing approval on the demo's few letters, as the runbook says.
    const env = { DATABASE_URL: urlAs(ANA), SOFTCRUM_OPS_APPROVAL_THRESHOLD: "0", COLUMNS: "120" };
    const json = async (args: string[], as = env) => {
      const result = await run([...args, "--json"], as);
      expect(result.code, `${args.join(" ")}: ${result.stderr}`).toBe(0);
      return JSON.parse(result.stdout);
    };

    // The ids the runbook says to take from `dlq list`.
    const letters = (await json(["dlq", "list"])).items as { id: string; errorClass: string }[];
    expect(letters.map((l) => l.errorClass).sort()).toEqual(["exhausted", "permanent", "poison", "poison", "poison"]);
    const permanent = letters.find((l) => l.errorClass === "permanent")?.id as string;
    const poison = letters.filter((l) => l.errorClass === "poison").map((l) => l.id);
    const nextPage = (await json(["dlq", "list", "--limit", "2"])).nextCursor as string;
    expect(nextPage).toEqual(expect.any(String));
    // A second batch to pause, resume and stop (the runbook's own one has completed by then).
    let watched: string | undefined;
    let created: string | undefined;
    const ran: string[] = [];

    for (const step of steps) {
      const command = step.args.slice(0, 2).join(" ");
      if (["batch pause", "batch resume", "batch stop"].includes(command) && !watched) {
        watched = (await json(["batch", "create", "--class", "poison", "--reason", "rehearsal", "--rate", "5"])).id;
        await json(["batch", "approve", watched as string], { ...env, DATABASE_URL: urlAs(BO) });
      }
      const id =
        command === "dlq replay-again"
          ? await lostReplay(permanent)
          : command === "dlq replay"
            ? permanent
            : command === "dlq discard"
              ? poison[0]
              : command === "dlq list"
                ? nextPage
                : permanent;
      const batch = ["batch pause", "batch resume", "batch stop"].includes(command) ? watched : created;
      const args = step.args.map((a) =>
        a
          .replace("<id>", id as string)
          .replace("<batch-id>", batch ?? "<no batch yet>")
          .replace("<cursor>", "00000000-0000-0000-0000-000000000000.00000000-0000-0000-0000-000000000000"),
      );
      const stepEnv: Record<string, string> = { ...env };
      for (const [name, value] of Object.entries(step.env)) {
        stepEnv[name] = value === "$APPROVER_DATABASE_URL" ? urlAs(BO) : value;
      }
      const result = await run(args, stepEnv);
      expect(result.code, `${step.line}\n${result.stderr}\n${result.stdout}`).toBe(0);
      expect(result.stderr, step.line).not.toMatch(/^error:/m);
      if (command === "dlq replay" || command === "dlq replay-again") {
        // What the replayed job then did: in-process, known at once (#21 item 9).
        expect(result.stdout).toMatch(/so far: 1 succeeded, 0 already done, 0 failed again, 0 not yet/);
      }
      if (command === "batch create") {
        created = (await json(["batch", "list"])).items[0].id;
        expect(result.stdout).toMatch(/status\s+awaiting_approval/);
      }
      ran.push(step.line);
    }
    expect(ran).toHaveLength(steps.length);

    // The batch the runbook walked through completed: its one notification went through.
    expect(await json(["batch", "show", created as string])).toMatchObject({
      status: "completed",
      requestedBy: ANA,
      approvedBy: BO,
      replayed: 1,
    });
    // Made for the consumer the demo reported (its build: "local"), and run against it (#21 item 6).
    const { consumerVersions } = await json(["batch", "show", created as string]);
    expect(Object.values(consumerVersions)).toEqual([expect.objectContaining({ version: "local" })]);
    expect(await json(["batch", "show", watched as string])).toMatchObject({ status: "stopped" });
  });

  test("every SQL query it shows runs on the demo database", async () => {
    const [batch] = await pg.sql<{ id: string }[]>`select id from core.replay_batches limit 1`;
    const queries = blocks("sql").filter((q) => !/create role|grant /i.test(q));
    expect(queries.length).toBeGreaterThanOrEqual(3);
    for (const query of queries) {
      for (const statement of query.split(";").filter((s) => s.replace(/--[^\n]*/g, "").trim() !== "")) {
        await pg.sql.unsafe(statement.replaceAll("<batch-id>", batch?.id ?? "00000000-0000-0000-0000-000000000000"));
      }
    }
  });
});

/**
 * A letter whose replay never ran (the copy lost with a killed in-process
 * CLI): a copy of `like`'s letter for a new job (a UUID v7), marked replayed, no fence.
 */
async function lostReplay(like: string): Promise<string> {
  const [row] = await pg.sql<{ id: string }[]>`
    with job as (select (lpad(to_hex((extract(epoch from now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid as job_id)
    insert into core.dead_letters (id, job_id, queue, consumer, payload, payload_sha256, attempts, last_error,
                                   error_class, status, status_changed_at, status_changed_by, status_reason)
    select gen_random_uuid(), job.job_id::text, d.queue, d.consumer,
           jsonb_set(d.payload::jsonb, '{job_id}', to_jsonb(job.job_id::text))::text, d.payload_sha256,
           d.attempts, d.last_error, d.error_class, 'replayed', now() - interval '1 hour', ${ANA}, 'lost copy'
    from core.dead_letters d, job where d.id = ${like}
    returning id`;
  return row?.id as string;
}

/** A connection logged in as `role`, as an operator with psql would have. */
async function asRole<T>(role: string, work: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(urlAs(role), { max: 1, onnotice: () => {} });
  try {
    return await work(sql);
  } finally {
    await sql.end({ timeout: 2 });
  }
}

/** The code of the error a statement failed with (undefined: it did not fail). */
const refusedWith = (statement: Promise<unknown>) =>
  statement.then(
    () => undefined,
    (error: { code?: string; message?: string }) => `${error.code}: ${error.message}`,
  );

describe("the shipped roles (#21 item 3)", () => {
  test("the forgery of item 7 is refused by the database: approved_by and audit rows cannot be typed by hand", async () => {
    // A batch of ana's waiting for approval (the threshold 0 makes any batch wait).
    const env = { DATABASE_URL: urlAs(ANA), SOFTCRUM_OPS_APPROVAL_THRESHOLD: "0" };
    const made = await run(
      ["batch", "create", "--class", "poison", "--reason", "forgery check", "--rate", "1", "--json"],
      env,
    );
    expect(made.code, made.stderr).toBe(0);
    const batch = JSON.parse(made.stdout).id as string;
    const auditBefore = (await pg.sql<{ n: number }[]>`select count(*)::int as n from core.ops_audit`)[0]?.n;

    const refusals = await asRole(ANA, async (sql) => ({
      // The runbook's old grants let these through (issue #21 item 7).
      updateBatch: await refusedWith(sql`update core.replay_batches set approved_by = ${BO} where id = ${batch}`),
      insertAudit: await refusedWith(sql`
        insert into core.ops_audit (id, at, operator, action, scope, result)
        values (gen_random_uuid(), now(), ${BO}, 'batch.approve', ${sql.json({ batchId: batch })}, 'ok')`),
      updateLetter: await refusedWith(sql`update core.dead_letters set status = 'discarded'`),
      deleteAudit: await refusedWith(sql`delete from core.ops_audit`),
      // The functions bind the actor to the login: naming someone else is refused.
      auditAsBo: await refusedWith(sql`
        select core.ops_audit_write(gen_random_uuid(), now(), ${BO}, 'batch.approve', '{}'::jsonb, 'ok', null)`),
      approveAsBo: await refusedWith(sql`select core.ops_batch_approve(${batch}::uuid, ${BO}, null)`),
      approveOwn: await refusedWith(sql`select core.ops_batch_approve(${batch}::uuid, null, null)`),
      pruneYoung: await refusedWith(sql`select core.ops_prune_audit(now(), 1000)`),
      // The database's own record of changes: readable, never typed, changed or deleted by a session.
      typeChange: await refusedWith(sql`insert into core.ops_changes (login, change) values (${BO}, 'x')`),
      dropChanges: await refusedWith(sql`delete from core.ops_changes`),
    }));
    expect(refusals.updateBatch).toMatch(/^42501: permission denied for table replay_batches/);
    expect(refusals.insertAudit).toMatch(/^42501: permission denied for table ops_audit/);
    expect(refusals.updateLetter).toMatch(/^42501: permission denied for table dead_letters/);
    expect(refusals.deleteAudit).toMatch(/^42501: permission denied for table ops_audit/);
    expect(refusals.auditAsBo).toMatch(new RegExp(`^42501: role ${ANA} may not act as ${BO}`));
    expect(refusals.approveAsBo).toMatch(/^42501: permission denied for function ops_batch_approve/);
    expect(refusals.approveOwn).toMatch(/^42501: permission denied for function ops_batch_approve/);
    expect(refusals.pruneYoung).toMatch(/^42501: audit entries younger than 30 days are never deleted/);
    expect(refusals.typeChange).toMatch(/^42501: permission denied for table ops_changes/);
    expect(refusals.dropChanges).toMatch(/^42501: permission denied for table ops_changes/);

    // bo may approve, but not his own batch, and not in someone else's name.
    const own = JSON.parse(
      (
        await run(["batch", "create", "--class", "poison", "--reason", "bo's own", "--rate", "1", "--json"], {
          ...env,
          DATABASE_URL: urlAs(BO),
        })
      ).stdout,
    ).id as string;
    const bo = await asRole(BO, async (sql) => ({
      approveOwn: await refusedWith(sql`select core.ops_batch_approve(${own}::uuid, null, null)`),
      approveAsCarla: await refusedWith(sql`select core.ops_batch_approve(${batch}::uuid, ${CARLA}, null)`),
    }));
    expect(bo.approveOwn).toMatch(new RegExp(`^42501: ${BO} requested batch ${own} and cannot approve it`));
    expect(bo.approveAsCarla).toMatch(new RegExp(`^42501: role ${BO} may not act as ${CARLA}`));

    // Nothing of the above was written; ana's batch still waits.
    expect((await pg.sql<{ n: number }[]>`select count(*)::int as n from core.ops_audit`)[0]?.n).toBe(
      (auditBefore ?? 0) + 1, // bo's batch.create
    );
    const [row] = await pg.sql<{ status: string; approved_by: string | null }[]>`
      select status, approved_by from core.replay_batches where id = ${batch}`;
    expect(row).toEqual({ status: "awaiting_approval", approved_by: null });

    // The real approval records the login that made it, in the row and the audit.
    const approved = await run(["batch", "approve", batch, "--json"], { ...env, DATABASE_URL: urlAs(BO) });
    expect(approved.code, approved.stderr).toBe(0);
    expect(JSON.parse(approved.stdout)).toMatchObject({ status: "ready", approvedBy: BO, requestedBy: ANA });
    const [audit] = await pg.sql<{ operator: string }[]>`
      select operator from core.ops_audit where action = 'batch.approve' and scope ->> 'batchId' = ${batch}`;
    expect(audit?.operator).toBe(BO);
    // A function called by hand from psql leaves no ops_audit row, but the database's own record names the login.
    const [poison] = await pg.sql<{ id: string }[]>`
      select id from core.dead_letters where status = 'pending_review' and error_class = 'poison' limit 1`;
    await asRole(
      ANA,
      (sql) => sql`select core.ops_discard_letters(${[poison?.id as string]}::uuid[], null, 'by hand')`,
    );
    const changes = await pg.sql<{ login: string; actor: string | null; change: string; to_state: string }[]>`
      select login, actor, change, to_state from core.ops_changes
      where target in (${poison?.id as string}::uuid, ${batch}::uuid) order by id`;
    expect(changes).toEqual([
      { login: ANA, actor: ANA, change: "replay_batch.created", to_state: "awaiting_approval" },
      { login: BO, actor: BO, change: "replay_batch.approved", to_state: "ready" },
      { login: ANA, actor: ANA, change: "dead_letter.status", to_state: "discarded" },
    ]);
    await run(["batch", "stop", batch, "--reason", "forgery check done"], env);
    await run(["batch", "stop", own, "--reason", "forgery check done"], { ...env, DATABASE_URL: urlAs(BO) });
  });

  test("a reader runs every read-only runbook command; each changing one is refused in one line naming the grant, before anything changes", async () => {
    const [letter] = await pg.sql<{ id: string }[]>`select id from core.dead_letters order by id limit 1`;
    const [batch] = await pg.sql<{ id: string }[]>`select id from core.replay_batches order by id limit 1`;
    const snapshot = () => pg.sql<{ state: string }[]>`
      select (select md5(string_agg(d::text, '' order by d.id)) from core.dead_letters d)
          || (select md5(string_agg(b::text, '' order by b.id)) from core.replay_batches b) as state`;
    const before = await snapshot();
    const env = { DATABASE_URL: urlAs(CARLA), COLUMNS: "120" };
    let reads = 0;
    let changes = 0;
    for (const step of runbookCommands()) {
      const command = step.args.slice(0, 2).join(" ");
      const args = step.args.map((a) =>
        a
          .replace("<id>", letter?.id as string)
          .replace("<batch-id>", batch?.id as string)
          .replace("<cursor>", "00000000-0000-0000-0000-000000000000.00000000-0000-0000-0000-000000000000"),
      );
      const stepEnv = { ...env, ...step.env, DATABASE_URL: urlAs(CARLA) };
      const result = await run(args, stepEnv);
      // Audit prune is an operator's command, its dry run too.
      const changing =
        ["dlq replay", "dlq replay-again", "dlq discard", "audit prune"].includes(command) ||
        (command.startsWith("batch ") && !["batch show", "batch list"].includes(command));
      if (changing) {
        changes += 1;
        expect(result.code, step.line).toBe(1);
        expect(result.stderr.trim().split("\n"), step.line).toHaveLength(1);
        expect(result.stderr, step.line).toMatch(
          new RegExp(
            `"${CARLA}" is not a member of softcrum_ops_(operator|approver) .*: grant softcrum_ops_\\w+ to ${CARLA}`,
          ),
        );
      } else {
        reads += 1;
        expect(result.code, `${step.line}\n${result.stderr}\n${result.stdout}`).toBe(0);
      }
    }
    expect(reads).toBeGreaterThanOrEqual(10);
    expect(changes).toBeGreaterThanOrEqual(10);
    expect(await snapshot()).toEqual(before);
  });
});

describe("the runbook's flow end to end, under the shipped roles (#21)", () => {
  test("find → understand → sample → approve → batch paced by live traffic → recovery report → discard with a reason", async () => {
    const env = { DATABASE_URL: urlAs(ANA), SOFTCRUM_OPS_APPROVAL_THRESHOLD: "0", COLUMNS: "160" };
    const approver = { ...env, DATABASE_URL: urlAs(BO) };
    const json = async (args: string[], as: Record<string, string> = env) => {
      const result = await run([...args, "--json"], as);
      expect(result.code, `${args.join(" ")}: ${result.stderr}`).toBe(0);
      return JSON.parse(result.stdout);
    };
    // An outage's letters: four credits of tenant "outage" the partner refused, each a valid job.
    const [template] = await pg.sql<{ payload: string }[]>`
      select payload from core.dead_letters where queue = 'loyalty.points' and error_class = 'permanent' limit 1`;
    for (let i = 0; i < 4; i++) {
      await pg.sql`
        with job as (select (lpad(to_hex((extract(epoch from now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid as id)
        insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
        select gen_random_uuid(), job.id::text, 'outage', 'loyalty.points', 'loyalty.award-points',
               jsonb_set(jsonb_set(${template?.payload as string}::jsonb, '{job_id}', to_jsonb(job.id::text)),
                         '{tenant_id}', '"outage"')::text,
               5, 'partner statement service down', 'exhausted'
        from job`;
    }

    // 1. Find: the tenant's pending letters, and how many.
    const found = (await json(["dlq", "list", "--tenant", "outage"])).items as { id: string; errorClass: string }[];
    expect(found.map((l) => l.errorClass)).toEqual(["exhausted", "exhausted", "exhausted", "exhausted"]);
    expect(await json(["dlq", "count", "--tenant", "outage"])).toMatchObject({ count: 4 });
    // 2. Understand one: its evidence and its history.
    const shown = await run(["dlq", "show", found[0]?.id as string], env);
    expect(shown.stdout).toMatch(/partner statement service down/);
    // 3–4. A sampled batch paced at a share of live traffic; another person approves it.
    const made = await json([
      "batch",
      "create",
      "--tenant",
      "outage",
      "--reason",
      "partner back",
      "--rate",
      "10%",
      "--rate-floor",
      "20",
      "--rate-ceiling",
      "50",
      "--sample",
      "1",
    ]);
    expect(made).toMatchObject({
      status: "awaiting_approval",
      selected: 4,
      rateShare: 0.1,
      rateFloor: 20,
      sampleSize: 1,
    });
    // Not by its requester (who is no approver either: refused before the database is asked).
    const own = await run(["batch", "approve", made.id], env);
    expect(own.code).toBe(1);
    expect(own.stderr).toMatch(/is not a member of softcrum_ops_approver/);
    expect(await json(["batch", "approve", made.id], approver)).toMatchObject({ status: "ready", approvedBy: BO });
    // The sample: its one outcome beside the selection's classes, then a pause for review (no terminal here).
    const sampled = await run(["batch", "run", made.id], env);
    expect(sampled.code).toBe(5);
    expect(sampled.stdout).toMatch(/exhausted\s+succeeded\s+partner statement service down/);
    expect(sampled.stdout).toMatch(/selection by error class: exhausted 4; 3 letters left after the sample/);
    await json(["batch", "resume", made.id, "--reason", "sample went through"]);
    // 5. The rest, paced: the runner reports its pace, at its floor with no live traffic here.
    const ran = await run(["batch", "run", made.id, "--json"], env);
    expect(ran.code, ran.stderr).toBe(0);
    const result = JSON.parse(ran.stdout.trim().split("\n").at(-1) as string);
    expect(result).toMatchObject({ event: "result", batch: { status: "completed", replayed: 4, skipped: 0 } });
    // 6. The recovery report: every replayed job resolved, with the time it took.
    const report = await run(["batch", "show", made.id], env);
    expect(report.stdout).toMatch(/recovery\s+done: 4 succeeded, 0 already done, 0 failed again in \S+/);
    expect(await json(["batch", "show", made.id])).toMatchObject({ recovered: true, succeeded: 4, failedAgain: 0 });
    // 7. A letter that can never succeed is discarded, with its reason, by the login that did it.
    const [poison] = await pg.sql<{ id: string }[]>`
      select id from core.dead_letters where status = 'pending_review' and error_class = 'poison' limit 1`;
    const discarded = await json(["dlq", "discard", poison?.id as string, "--reason", "producer bug fixed in 4.2.1"]);
    expect(discarded.counts).toEqual({ discarded: 1 });
    const [row] = await pg.sql<{ status_changed_by: string; status_reason: string }[]>`
      select status_changed_by, status_reason from core.dead_letters where id = ${poison?.id as string}`;
    expect(row).toEqual({ status_changed_by: ANA, status_reason: "producer bug fixed in 4.2.1" });
    // Every step is in the audit, under the login that took it.
    const audit = await pg.sql<{ operator: string; action: string; result: string }[]>`
      select operator, action, result from core.ops_audit
      where scope ->> 'batchId' = ${made.id} or scope -> 'ids' ? ${poison?.id as string} order by at, id`;
    expect(audit.map((a) => `${a.operator} ${a.action} ${a.result}`)).toEqual([
      `${ANA} batch.create ok`,
      `${BO} batch.approve ok`,
      `${ANA} batch.run ok`,
      `${ANA} batch.pause ok`,
      `${ANA} batch.resume ok`,
      `${ANA} batch.run ok`,
      `${ANA} dead_letter.discard ok`,
    ]);
  });
});
