/**
 * `pnpm ops …` (or the `softcrum-ops` bin): the operator CLI for dead letters
 * and replay batches. Needs DATABASE_URL. Human tables by default, fitted to
 * the terminal (`--wide` for whole cells); `--json` for scripts (`batch run
 * --json` streams NDJSON events).
 *
 * Who acts is the database role DATABASE_URL logs in as (`session_user`),
 * proven by the database's authentication; there is no `--operator`. One
 * person cannot approve their own batch under another name: they would need
 * another person's database credential (ADR 0003, the runbook's "Database roles").
 * SOFTCRUM_OPS_APPROVAL_THRESHOLD: batches selecting more letters than this
 * need a second operator's approval (default 100; it can only be lowered).
 *
 * No command migrates or creates anything: a database that is not reachable,
 * does not exist, has no Softcrum tables or refuses the role a privilege is a
 * one-line error naming the cause (exit 1).
 *
 * Exit codes: 0 done; 1 unexpected failure or an unusable database; 2 bad
 * input (a flag, a missing reason, more ids than a direct replay takes);
 * 3 not found (none of the ids exists); 4 refused (the state or a rule forbids
 * it: awaiting approval, approving your own batch, a letter already replayed
 * or that no transport here can deliver to its consumer); 5 partly done (some ids not
 * acted on, or the batch ended without completing: paused, stopped or expired).
 */
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { isSoftcrumError, type QueuePort } from "@softcrum/core";
import {
  createOps,
  DEFAULT_AUDIT_RETENTION_DAYS,
  DEFAULT_BATCH_POLICY,
  type DeadLetterFilter,
  MIN_AUDIT_RETENTION_DAYS,
  type Ops,
} from "@softcrum/core/ops";
import { Command, CommanderError, Option } from "commander";
import { printBatch, rateOptions, runBatch } from "./batch-run.ts";
import { batchPolicyFromEnv, ExitError, filterOptions, readFilter } from "./cli-options.ts";
import { openReplayTransport, replayTransportKind } from "./composition.ts";
import {
  DatabaseProblem,
  describeTarget,
  explainDatabaseError,
  isDatabaseError,
  type OpsDatabase,
  openOpsDatabase,
  type ShippedRole,
} from "./database.ts";
import { duration, humanMs, json, nameFlags, table } from "./format.ts";
import { EXIT, out, printLetter, printReport, replayOutcomeLine, view, withAge } from "./output.ts";

// Moved by role (output.ts); exported from here unchanged.
export { EXIT };

interface Context {
  readonly ops: Ops;
  /** The database role this CLI logged in as: who acts. */
  readonly operator: string;
}

/**
 * What a command needs: `read` and `write` only the database (nothing is
 * published); `publish` also the transport replays go out through.
 */
type Needs = "read" | "write" | "publish";

/** A transport for commands that never publish: a publish would be a bug, so it fails loudly. */
const noPublishing: QueuePort = {
  publish: async () => {
    throw new Error("this command does not publish");
  },
  schedule: async () => {
    throw new Error("this command does not publish");
  },
};

/** The library's field names → the flags of the command running, for error messages. */
let flagsInUse: Record<string, string> = {};
/** A name typed with --operator (refused, and audited as an attempt to act as someone). */
let typedOperator: string | undefined;
/** The command running, e.g. "batch approve", for the audit of a refused identity. */
let commandPath = "";

/** Commands that change something: a refusal of one is audited, whichever layer refused it (#10 item 5). */
const MUTATING = new Set([
  "dlq replay",
  "dlq replay-again",
  "dlq discard",
  "batch create",
  "batch approve",
  "batch pause",
  "batch resume",
  "batch stop",
  "batch run",
  "audit prune",
]);

/** Records a refusal the CLI itself made (the library audits its own), under the role logged in. */
async function auditCliRefusal(
  database: OpsDatabase,
  path: string,
  result: "refused" | "rejected",
  detail: string,
  scope: Record<string, unknown> = {},
) {
  await createOps({ db: database.db, queue: noPublishing })
    .deadLetters.audit({
      operator: database.operator,
      action: `cli.${path.replaceAll(" ", ".")}`,
      scope,
      result,
      detail,
    })
    .catch(() => {});
}

/**
 * A mutating command refused before it reached the database (a missing
 * --reason, an unknown flag): audited when the database can be reached, else
 * only reported (the usage error is what the operator needs to see).
 */
async function auditUsageRefusal(args: string[], detail: string) {
  const path = args
    .filter((a) => !a.startsWith("-"))
    .slice(0, 2)
    .join(" ");
  const url = process.env["DATABASE_URL"];
  if (!MUTATING.has(path) || !url) return;
  const database = await openOpsDatabase(url).catch(() => undefined);
  if (!database) return;
  try {
    await auditCliRefusal(database, path, "rejected", detail);
  } finally {
    await database.close();
  }
}

/** Opens the database (checked, never migrated) and, to publish, the transport; closes both. */
async function withOps(needs: Needs, run: (ctx: Context) => Promise<void>): Promise<void> {
  const databaseUrl = process.env["DATABASE_URL"];
  if (!databaseUrl) throw new ExitError(EXIT.usage, "DATABASE_URL is not set: the CLI works on the module's database");
  const batchPolicy = batchPolicyFromEnv();
  const database = await openOpsDatabase(databaseUrl);
  try {
    const problem = identityProblem(database.operator);
    if (problem) {
      // An attempt to act under another name is evidence: audited under the role that made it.
      await auditCliRefusal(database, commandPath, "refused", problem, {
        declaredOperator: typedOperator ?? process.env["SOFTCRUM_OPERATOR"],
      });
      throw new ExitError(EXIT.usage, problem);
    }
    try {
      if (needs !== "read") await requireRole(database, commandPath === "batch approve" ? "approver" : "operator");
      await runWith(needs, database, databaseUrl, batchPolicy, run);
    } catch (error) {
      // The CLI's own refusals of a mutating command (the library audits those it makes).
      if (error instanceof ExitError && MUTATING.has(commandPath)) {
        await auditCliRefusal(database, commandPath, "rejected", error.message);
      }
      throw error;
    }
  } finally {
    await database.close();
  }
}

/** Runs a command on the checked database; one that publishes also opens the transport. */
async function runWith(
  needs: Needs,
  database: OpsDatabase,
  databaseUrl: string,
  batchPolicy: { approvalThreshold?: number },
  run: (ctx: Context) => Promise<void>,
): Promise<void> {
  if (needs !== "publish") {
    await run({ ops: createOps({ db: database.db, queue: noPublishing, batchPolicy }), operator: database.operator });
    return;
  }
  // The platform transport and the modules' replay routes (composition.ts): a
  // letter no transport here can deliver is refused, never "replayed".
  // In-process, the module's consumers run in this process under this login:
  // checked before they are started (their own start check would fail less clearly).
  if (replayTransportKind() === "in-process") await requireRole(database, "worker");
  const transport = await openReplayTransport({ databaseUrl });
  try {
    await run({
      // SOFTCRUM_OPS_APPROVAL_THRESHOLD is a batch setting; direct replays keep
      // the library's threshold over the rolling window (#10 item 4).
      ops: createOps({
        db: database.db,
        replay: transport.replay,
        batchPolicy,
        approvalThreshold: DEFAULT_BATCH_POLICY.approvalThreshold,
        ...(transport.strain ? { strain: transport.strain } : {}),
      }),
      operator: database.operator,
    });
  } finally {
    await transport.close();
  }
}

/**
 * Refuses, before anything changes, a command this login's roles do not
 * allow (#21 item 3): one line naming the role to grant. The database
 * refuses it anyway; this says so before a letter is touched.
 */
async function requireRole(database: OpsDatabase, needed: "operator" | "approver" | "worker"): Promise<void> {
  const role = `softcrum_${needed === "worker" ? "worker" : `ops_${needed}`}` as ShippedRole;
  if (await database.mayActAs(role)) return;
  const why =
    needed === "worker"
      ? "with the in-process queue, replays run the module's consumers inside this CLI"
      : needed === "approver"
        ? "approving another person's batch needs it"
        : `"${commandPath}" changes state`;
  throw new ExitError(
    EXIT.failure,
    `the database role "${database.operator}" is not a member of ${role} (${why}): grant ${role} to ${database.operator} (runbooks/dead-letter-replay.md, "Database roles")`,
  );
}

/**
 * A name typed with --operator or set in SOFTCRUM_OPERATOR is not an identity:
 * refused when it names anyone but the role logged in (ADR 0003).
 */
function identityProblem(operator: string): string | undefined {
  if (typedOperator !== undefined) {
    return `--operator is not accepted: the CLI acts as the database role it logs in as ("${operator}"), which the database authenticated; to act as someone else, use their credential, never their name`;
  }
  const declared = process.env["SOFTCRUM_OPERATOR"]?.trim();
  if (declared && declared !== operator) {
    return `SOFTCRUM_OPERATOR is "${declared}", but the CLI acts as the database role it logs in as, "${operator}": unset SOFTCRUM_OPERATOR, or use your own database credential in DATABASE_URL`;
  }
  return undefined;
}

function filterFrom(o: Record<string, string | undefined>, withStatus = true): DeadLetterFilter {
  const { filter, flags } = readFilter(o, withStatus);
  flagsInUse = { ...flagsInUse, ...flags };
  return filter;
}

const COMMON = (command: Command) =>
  command.option("--json", "JSON output").option("--wide", "print every cell whole (tables are cut to the terminal)");

export function buildProgram(): Command {
  const program = new Command("ops")
    .description(
      "Review, replay and discard dead letters; run replay batches. Acts as the database role of DATABASE_URL.",
    )
    .exitOverride()
    .showHelpAfterError()
    .hook("preAction", (_program, action) => {
      const names: string[] = [];
      for (let c: Command | null = action; c && c !== _program; c = c.parent) names.unshift(c.name());
      commandPath = names.join(" ");
    });

  const dlq = program.command("dlq").description("dead letters");

  COMMON(filterOptions(dlq.command("list").description("list dead letters, newest first")))
    .addOption(new Option("--status <status>", "pending_review | replayed | discarded").default("pending_review"))
    .option("--all", "any status (overrides --status)")
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <id>", "continue after this id (printed at the end of a page)")
    .option("--oldest", "oldest first")
    .action((o) =>
      withOps("read", async ({ ops }) => {
        const filter = filterFrom({ ...o, status: o.all ? undefined : o.status });
        const page = await ops.deadLetters.list(filter, {
          limit: o.limit,
          ...(o.cursor ? { cursor: o.cursor } : {}),
          order: o.oldest ? "oldest" : "newest",
        });
        if (o.json) {
          out(json(page));
          return;
        }
        // The columns that tell letters apart; --wide adds the rest, whole.
        const columns = o.wide
          ? [
              "id",
              "createdAt",
              "age",
              "queue",
              "consumer",
              "tenantId",
              "kind",
              "errorClass",
              "attempts",
              "status",
              "lastError",
            ]
          : ["id", "age", "consumer", "tenantId", "errorClass", "attempts", "status", "lastError"];
        out(table(withAge(page.items, "createdAt"), columns, view(o)));
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  COMMON(filterOptions(dlq.command("count").description("count dead letters (pending ones unless --status or --all)")))
    .addOption(new Option("--status <status>", "pending_review | replayed | discarded").default("pending_review"))
    .option("--all", "any status (overrides --status)")
    .action((o) =>
      withOps("read", async ({ ops }) => {
        const count = await ops.deadLetters.count(filterFrom({ ...o, status: o.all ? undefined : o.status }));
        out(o.json ? json({ count }) : String(count));
      }),
    );

  COMMON(dlq.command("show <id>").description("one dead letter: evidence, payload, related failures, history")).action(
    (id, o) =>
      withOps("read", async ({ ops }) => {
        const d = await ops.deadLetters.get(id);
        if (o.json) {
          out(json(d));
          return;
        }
        printLetter(d, o);
      }),
  );

  const verbs = {
    replay: "republish the original envelope (same job_id); safe: the fence stops a second effect",
    "replay-again": "replay again letters marked replayed whose replay never ran (no fence, no newer letter)",
    discard: "close letters that will never be replayed",
  } as const;
  for (const [verb, description] of Object.entries(verbs) as [keyof typeof verbs, string][]) {
    COMMON(
      dlq.command(`${verb} <ids...>`).description(description).requiredOption("--reason <text>", "why (recorded)"),
    ).action((ids: string[], o) =>
      withOps(verb === "discard" ? "write" : "publish", async ({ ops, operator }) => {
        flagsInUse = { reason: "--reason", ids: "<ids>" };
        const input = { operator, reason: o.reason };
        const act =
          verb === "replay"
            ? ops.deadLetters.replay(ids, input)
            : verb === "replay-again"
              ? ops.deadLetters.replayAgain(ids, input)
              : ops.deadLetters.discard(ids, input);
        const report = await act;
        printReport(report, o);
        // Whether the replayed jobs then ran (#21 item 9): known at once in-process, later on a hosted queue.
        const replayed = report.results.filter((r) => r.outcome === "replayed").map((r) => r.id);
        if (!o.json && replayed.length > 0) out(replayOutcomeLine(await ops.deadLetters.replayOutcomes(replayed)));
      }),
    );
  }

  COMMON(dlq.command("failed-after-replay").description("replayed jobs that failed again (the replay-DLQ view)"))
    .option("--batch <id>", "only this batch")
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <cursor>", "continue from this cursor (printed at the end of a page)")
    .action((o) =>
      withOps("read", async ({ ops }) => {
        flagsInUse = { limit: "--limit", cursor: "--cursor", "batch id": "--batch" };
        const page = await ops.deadLetters.failedAfterReplay(o.batch ? { batchId: o.batch } : {}, {
          limit: o.limit,
          ...(o.cursor ? { cursor: o.cursor } : {}),
        });
        if (o.json) {
          out(json(page));
          return;
        }
        out(
          table(
            withAge(page.items, "createdAt"),
            ["id", "age", "batchId", "replayedFrom", "consumer", "errorClass", "lastError", "createdAt"],
            view(o),
          ),
        );
        // A page reads a bounded number of replayed letters, so it may be short (even empty) with more to come.
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  COMMON(dlq.command("history <id>").description("a letter's audit history, oldest first, a page at a time"))
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <id>", "continue after this entry (printed at the end of a page)")
    .action((id, o) =>
      withOps("read", async ({ ops }) => {
        flagsInUse = { limit: "--limit", cursor: "--cursor" };
        const page = await ops.deadLetters.history(id, { limit: o.limit, ...(o.cursor ? { cursor: o.cursor } : {}) });
        if (o.json) {
          out(json(page));
          return;
        }
        out(table(withAge(page.items, "at"), ["at", "age", "operator", "action", "result", "detail"], view(o)));
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  COMMON(dlq.command("depth").description("pending dead letters and the oldest age, per queue and consumer")).action(
    (o) =>
      withOps("read", async ({ ops }) => {
        const items = await ops.deadLetters.depth();
        if (o.json) {
          out(json({ items }));
          return;
        }
        out(
          table(
            items.map((i) => ({ ...i, oldest: duration(i.oldestPendingAgeMs) })),
            ["queue", "consumer", "pending", "oldest"],
            view(o),
          ),
        );
      }),
  );

  COMMON(
    program
      .command("audit")
      .description("the audit log (core.ops_audit)")
      .command("prune")
      .description(
        `delete audit entries older than the retention (never fewer than ${MIN_AUDIT_RETENTION_DAYS} days); the prune is audited`,
      )
      .option(
        "--retention-days <days>",
        `keep this many days (default $SOFTCRUM_AUDIT_RETENTION_DAYS or ${DEFAULT_AUDIT_RETENTION_DAYS})`,
      )
      .option("--dry-run", "count what would be deleted, delete nothing"),
  ).action((o) =>
    withOps("write", async ({ ops, operator }) => {
      flagsInUse = { retentionDays: "--retention-days" };
      const retentionDays =
        o.retentionDays ?? process.env["SOFTCRUM_AUDIT_RETENTION_DAYS"] ?? DEFAULT_AUDIT_RETENTION_DAYS;
      const report = await ops.deadLetters.pruneAudit({ operator, retentionDays, dryRun: Boolean(o.dryRun) });
      out(
        o.json
          ? json(report)
          : `${report.dryRun ? "dry run: would delete" : "deleted"} ${report.deleted} audit entries older than ${report.cutoff.toISOString()} (${retentionDays} days)`,
      );
    }),
  );

  const batch = program.command("batch").description("replay batches");

  COMMON(filterOptions(batch.command("create").description("select pending letters into a replay batch")))
    .requiredOption("--reason <text>", "why (recorded)")
    .requiredOption(
      "--rate <perSecond|share%>",
      "replays per second, or a share of the consumers' live throughput (10%), re-measured at every chunk",
    )
    .option("--rate-floor <perSecond>", "with --rate N%: the paced rate's floor", "0.1")
    .option("--rate-ceiling <perSecond>", "with --rate N%: the paced rate's ceiling", "50")
    .option("--batch-size <n>", "replays between checks of the stop conditions", "50")
    .option("--sample <n>", "replay this many first; continue only if none fails again")
    .option("--max-failure-rate <fraction>", "pause above this share of failed-again replays", "0.2")
    .option(
      "--max-duplicate-rate <fraction>",
      "pause above this share of replays whose job was already done (a wrong selection)",
      "0.5",
    )
    .option("--max-rate-limited-x <n>", "pause when its consumers' rate-limited share passes n × the one before", "3")
    .option("--max-latency-x <n>", "pause when its consumers' handler p95 passes n × the one before", "3")
    .option("--limit <n>", "at most this many letters (oldest first)")
    .option("--expires-in <minutes>", "the batch does not run after this", "1440")
    .action((o) =>
      withOps("write", async ({ ops, operator }) => {
        const filter = filterFrom(o, false);
        flagsInUse = {
          ...flagsInUse,
          reason: "--reason",
          ratePerSecond: "--rate",
          rateShareOfLive: "--rate",
          rateFloorPerSecond: "--rate-floor",
          batchSize: "--batch-size",
          sampleSize: "--sample",
          maxFailureRate: "--max-failure-rate",
          maxDuplicateRate: "--max-duplicate-rate",
          maxRateLimitedMultiple: "--max-rate-limited-x",
          maxLatencyMultiple: "--max-latency-x",
          limit: "--limit",
          expiresInMinutes: "--expires-in",
          expiresAt: "--expires-in",
          "filter.status": "--status",
        };
        const created = await ops.batches.create({
          filter,
          operator,
          reason: o.reason,
          ...rateOptions(o),
          batchSize: o.batchSize,
          maxFailureRate: o.maxFailureRate,
          maxDuplicateRate: o.maxDuplicateRate,
          maxRateLimitedMultiple: o.maxRateLimitedX,
          maxLatencyMultiple: o.maxLatencyX,
          expiresInMinutes: o.expiresIn,
          ...(o.sample ? { sampleSize: o.sample } : {}),
          ...(o.limit ? { limit: o.limit } : {}),
        });
        printBatch(created, o);
        if (!o.json && created.status === "awaiting_approval") {
          out(
            `\n${created.selected} letters: another operator, logged in with their own database role, must approve: pnpm ops batch approve ${created.id}`,
          );
        }
      }),
    );

  COMMON(batch.command("approve <id>").description("approve a large batch (not your own)")).action((id, o) =>
    withOps("write", async ({ ops, operator }) => printBatch(await ops.batches.approve(id, { operator }), o)),
  );

  for (const verb of ["pause", "resume", "stop"] as const) {
    COMMON(
      batch
        .command(`${verb} <id>`)
        .description(
          verb === "stop"
            ? "stop for good"
            : verb === "pause"
              ? "pause; a running runner stops after its chunk"
              : "make a paused batch runnable again",
        )
        .requiredOption("--reason <text>", "why (recorded)"),
    ).action((id, o) =>
      withOps("write", async ({ ops, operator }) => {
        flagsInUse = { reason: "--reason" };
        printBatch(await ops.batches[verb](id, { operator, reason: o.reason }), o);
      }),
    );
  }

  batch
    .command("run <id>")
    .description("replay the batch at its rate, with progress; Ctrl-C pauses it")
    .option("--no-progress", "no progress bar")
    .option("--json", "stream NDJSON: one progress event per line while it runs, then the result")
    .option("--wide", "print every cell whole")
    .option("--continue-after-sample", "go on after a passing sample without asking (scripts; it is still shown)")
    .action((id, o) => withOps("publish", ({ ops, operator }) => runBatch(ops, operator, id, o)));

  COMMON(batch.command("show <id>").description("a batch with live counts")).action((id, o) =>
    withOps("read", async ({ ops }) => printBatch(await ops.batches.get(id), o)),
  );

  COMMON(batch.command("list").description("recent batches, newest first"))
    .option("--status <status>", "only this status")
    .action((o) =>
      withOps("read", async ({ ops }) => {
        flagsInUse = { status: "--status" };
        const items = await ops.batches.list(o.status ? { status: o.status } : undefined);
        if (o.json) {
          out(json({ items }));
          return;
        }
        out(
          table(
            // The library's stop reasons count time in ms ("within 600000 ms"): human units here.
            withAge(items, "createdAt").map((b) => ({ ...b, stopReason: humanMs(String(b["stopReason"] ?? "")) })),
            ["id", "status", "requestedBy", "approvedBy", "selected", "replayed", "failedAgain", "age", "stopReason"],
            view(o),
          ),
        );
      }),
    );

  return program;
}

const BY_CODE: Record<string, number> = {
  INVALID_INPUT: EXIT.usage,
  NOT_FOUND: EXIT.notFound,
  CONFLICT: EXIT.conflict,
  FORBIDDEN: EXIT.conflict,
  NOT_ROUTABLE: EXIT.conflict,
};

/** Runs the CLI and returns its exit code. Errors are one line, never SQL or its parameters. */
export async function main(argv: string[]): Promise<number> {
  flagsInUse = {};
  process.exitCode = undefined;
  // --operator is taken out here and refused once the CLI knows who is logged in (so the attempt is audited).
  typedOperator = undefined;
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "--operator") typedOperator = argv[++i] ?? "";
    else if (arg.startsWith("--operator=")) typedOperator = arg.slice("--operator=".length);
    else args.push(arg);
  }
  try {
    await buildProgram().parseAsync(args, { from: "user" });
    return typeof process.exitCode === "number" ? process.exitCode : EXIT.ok;
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.exitCode === 0) return EXIT.ok; // help or version
      await auditUsageRefusal(args, error.message);
      return EXIT.usage; // commander printed the usage problem
    }
    if (error instanceof ExitError) {
      process.stderr.write(`error: ${error.message}\n`);
      return error.exitCode;
    }
    if (error instanceof DatabaseProblem) {
      process.stderr.write(`error: ${error.message}\n`);
      return EXIT.failure;
    }
    if (isSoftcrumError(error)) {
      process.stderr.write(`error: ${humanMs(oneLine(nameFlags(error.message, flagsInUse)))}\n`);
      return BY_CODE[error.code] ?? EXIT.failure;
    }
    if (isDatabaseError(error)) {
      process.stderr.write(
        `error: ${explainDatabaseError(error, describeTarget(process.env["DATABASE_URL"] ?? ""))}\n`,
      );
      return EXIT.failure;
    }
    process.stderr.write(`error: ${oneLine(error instanceof Error ? error.message : String(error))}\n`);
    return EXIT.failure;
  }
}

function oneLine(message: string): string {
  return message.split("\n")[0]?.trim() ?? "";
}

/** Whether this module is the process's entry point (the tsx source, or the compiled bin through its symlink). */
function isEntryPoint(): boolean {
  if (!process.argv[1]) return false;
  try {
    return realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

/** Runs the CLI as a process: sets the exit code, and makes sure the process exits. */
export async function runCli(argv: string[]): Promise<void> {
  const code = await main(argv);
  process.exitCode = code;
  // The process always exits: nothing left open (a pool that never closes) may keep it up.
  setTimeout(() => process.exit(code), 2000).unref();
}

if (isEntryPoint()) await runCli(process.argv.slice(2));
