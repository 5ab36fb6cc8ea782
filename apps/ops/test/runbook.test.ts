import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { runScript, type ScriptResult, useTestDatabase } from "@softcrum/testing";
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

const urlAs = (role: string) => {
  const u = new URL(pg.url);
  u.username = role;
  u.password = "operator-password";
  return u.toString();
};

async function operatorRole(role: string) {
  await pg.sql
    .unsafe(
      `do $$ begin create role ${role} login password 'operator-password'; exception when others then null; end $$`,
    )
    .catch(() => {});
  // The runbook's "Database roles" grants, plus the module's tables (in-process replays run in the CLI).
  await pg.sql.unsafe(`
    grant usage on schema core, loyalty, drizzle to ${role};
    grant select, insert, update, delete on all tables in schema core, loyalty to ${role};
    grant select on all tables in schema drizzle to ${role};
    grant usage on all sequences in schema core, loyalty to ${role}`);
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
  await operatorRole(ANA);
  await operatorRole(BO);
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
        command === "dlq replay"
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
      expect(result.code, `${step.line}\n${result.stderr}`).toBe(0);
      expect(result.stderr, step.line).not.toMatch(/^error:/m);
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
