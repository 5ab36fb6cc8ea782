/**
 * `pnpm ops …`: the operator CLI for dead letters and replay batches.
 * Needs DATABASE_URL; mutating commands need an operator (--operator or
 * SOFTCRUM_OPERATOR). Human tables by default, --json for scripts.
 * SOFTCRUM_OPS_APPROVAL_THRESHOLD: batches selecting more letters than this
 * need a second operator's approval (default 100; it can only be lowered).
 * The operator name is declared, not proven: the CLI's authority is the
 * database credential in DATABASE_URL. Where identity must be proven, use
 * the HTTP handlers, which take the operator from a verified token.
 *
 * Exit codes: 0 done; 1 unexpected failure; 2 bad input (filter, missing
 * reason or operator, more ids than a direct replay takes); 3 not found (none
 * of the ids exists); 4 refused (the state or a rule forbids it:
 * awaiting approval, approving your own batch, a letter already replayed or
 * that no transport here can deliver to its consumer); 5 partly done (some ids not acted on, or the batch ended without
 * completing: paused, stopped or expired).
 */
import { isSoftcrumError } from "@softcrum/core";
import {
  type ActionReport,
  type BatchView,
  createOps,
  DEFAULT_AUDIT_RETENTION_DAYS,
  DEFAULT_BATCH_POLICY,
  type DeadLetterFilter,
  MIN_AUDIT_RETENTION_DAYS,
  type Ops,
} from "@softcrum/core/ops";
import { SingleBar } from "cli-progress";
import { Command, CommanderError, Option } from "commander";
import { openOps } from "./composition.ts";
import { fields, json, table, text } from "./format.ts";

export const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, conflict: 4, partial: 5 } as const;

class ExitError extends Error {
  constructor(
    readonly exitCode: number,
    message: string,
  ) {
    super(message);
  }
}

interface Context {
  ops: Ops;
}

/** Opens the database and queue once per command, and closes them (letting in-process replays finish). */
async function withOps<T>(run: (ctx: Context) => Promise<T>): Promise<T> {
  if (!process.env["DATABASE_URL"])
    throw new ExitError(EXIT.usage, "DATABASE_URL is not set: the CLI works on the module's database");
  // The platform transport and the modules' replay routes (composition.ts): a
  // letter no transport here can deliver is refused, never "replayed".
  const composed = await openOps();
  try {
    return await run({
      ops: createOps({ db: composed.db, replay: composed.replay, batchPolicy: batchPolicyFromEnv() }),
    });
  } finally {
    await composed.close();
  }
}

function batchPolicyFromEnv(): { approvalThreshold?: number } {
  const raw = process.env["SOFTCRUM_OPS_APPROVAL_THRESHOLD"];
  if (raw === undefined || raw === "") return {};
  const threshold = Number(raw);
  // It can only make approval stricter: whoever runs the CLI must not be able to skip the second operator.
  if (!Number.isInteger(threshold) || threshold < 0 || threshold > DEFAULT_BATCH_POLICY.approvalThreshold) {
    throw new ExitError(
      EXIT.usage,
      `SOFTCRUM_OPS_APPROVAL_THRESHOLD must be a whole number from 0 to ${DEFAULT_BATCH_POLICY.approvalThreshold}, got ${raw}`,
    );
  }
  return { approvalThreshold: threshold };
}

const filterOptions = (command: Command) =>
  command
    .option("--queue <name>", "only this queue")
    .option("--consumer <name>", "only this consumer")
    .option("--tenant <id>", "only this tenant")
    .option("--kind <kind>", "only this envelope kind")
    .option("--class <errorClass>", "poison | exhausted | permanent | expired")
    .option("--since <time>", "created at or after (ISO 8601)")
    .option("--until <time>", "created before (ISO 8601)");

function filterFrom(o: Record<string, string | undefined>, withStatus = true): DeadLetterFilter {
  const f: Record<string, string> = {};
  const put = (key: string, value: string | undefined) => {
    if (value !== undefined) f[key] = value;
  };
  put("queue", o["queue"]);
  put("consumer", o["consumer"]);
  put("tenantId", o["tenant"]);
  put("kind", o["kind"]);
  put("errorClass", o["class"]);
  if (withStatus) put("status", o["status"]);
  put("createdAfter", o["since"]);
  put("createdBefore", o["until"]);
  return f as DeadLetterFilter;
}

function operatorFrom(o: { operator?: string }): string {
  const operator = o.operator ?? process.env["SOFTCRUM_OPERATOR"];
  if (!operator?.trim())
    throw new ExitError(EXIT.usage, "who is acting? pass --operator NAME or set SOFTCRUM_OPERATOR");
  return operator;
}

const out = (line: string) => process.stdout.write(`${line}\n`);

function printReport(report: ActionReport, asJson: boolean) {
  if (asJson) out(json(report));
  else {
    out(table(report.results as unknown as Record<string, unknown>[], ["id", "outcome", "detail"]));
    out(
      Object.entries(report.counts)
        .map(([k, v]) => `${k}: ${v}`)
        .join(", "),
    );
  }
  // None of the ids exists: "not found"; none acted on (already replayed,
  // not routable, not replayable): "refused"; some not acted on: "partly done".
  const acted = (r: { outcome: string }) => r.outcome === "replayed" || r.outcome === "discarded";
  if (report.results.every((r) => r.outcome === "not_found")) process.exitCode = EXIT.notFound;
  else if (!report.results.some(acted)) process.exitCode = EXIT.conflict;
  else if (!report.results.every(acted)) process.exitCode = EXIT.partial;
}

const BATCH_FIELDS = [
  "id",
  "status",
  "filter",
  "reason",
  "requestedBy",
  "approvedBy",
  "ratePerSecond",
  "batchSize",
  "sampleSize",
  "maxFailureRate",
  "expiresAt",
  "selected",
  "replayed",
  "skipped",
  "succeeded",
  "failedAgain",
  "unresolved",
  "pending",
  "createdAt",
  "startedAt",
  "endedAt",
  "stopReason",
];

function printBatch(batch: BatchView, asJson: boolean) {
  if (asJson) out(json(batch));
  else out(fields(batch as unknown as Record<string, unknown>, BATCH_FIELDS));
}

export function buildProgram(): Command {
  const program = new Command("ops")
    .description("Review, replay and discard dead letters; run replay batches.")
    .exitOverride()
    .showHelpAfterError();

  const dlq = program.command("dlq").description("dead letters");

  filterOptions(dlq.command("list").description("list dead letters, newest first"))
    .addOption(new Option("--status <status>", "pending_review | replayed | discarded").default("pending_review"))
    .option("--all", "any status (overrides --status)")
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <id>", "continue after this id (printed at the end of a page)")
    .option("--oldest", "oldest first")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
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
        out(
          table(page.items as unknown as Record<string, unknown>[], [
            "id",
            "createdAt",
            "queue",
            "consumer",
            "tenantId",
            "kind",
            "errorClass",
            "attempts",
            "status",
            "lastError",
          ]),
        );
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  filterOptions(dlq.command("count").description("count dead letters (pending ones unless --status or --all)"))
    .addOption(new Option("--status <status>", "pending_review | replayed | discarded").default("pending_review"))
    .option("--all", "any status (overrides --status)")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const count = await ops.deadLetters.count(filterFrom({ ...o, status: o.all ? undefined : o.status }));
        out(o.json ? json({ count }) : String(count));
      }),
    );

  dlq
    .command("show <id>")
    .description("one dead letter: evidence, payload, related failures, history")
    .option("--json", "JSON output")
    .action((id, o) =>
      withOps(async ({ ops }) => {
        const d = await ops.deadLetters.get(id);
        if (o.json) {
          out(json(d));
          return;
        }
        out(
          fields(d as unknown as Record<string, unknown>, [
            "id",
            "status",
            "queue",
            "consumer",
            "jobId",
            "tenantId",
            "kind",
            "correlationId",
            "errorClass",
            "attempts",
            "occurrences",
            "createdAt",
            "lastSeenAt",
            "statusChangedAt",
            "statusChangedBy",
            "statusReason",
            "replayBatchId",
          ]),
        );
        out(`\nlast error:\n  ${d.lastError}`);
        out(`\npayload (${d.payloadEncoding}, as received):\n  ${d.payloadText}`);
        if (d.related.length)
          out(
            `\nrelated failures of this job:\n${table(d.related as unknown as Record<string, unknown>[], ["id", "createdAt", "errorClass", "status", "replayBatchId"])}`,
          );
        if (d.history.length)
          out(
            `\nhistory:\n${table(d.history as unknown as Record<string, unknown>[], ["at", "operator", "action", "result", "detail"])}`,
          );
        if (d.historyNextCursor) out(`more history: pnpm ops dlq history ${d.id} --cursor ${d.historyNextCursor}`);
      }),
    );

  for (const verb of ["replay", "discard"] as const) {
    dlq
      .command(`${verb} <ids...>`)
      .description(
        verb === "replay"
          ? "republish the original envelope (same job_id); safe: the fence stops a second effect"
          : "close letters that will never be replayed",
      )
      .requiredOption("--reason <text>", "why (recorded)")
      .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
      .option("--json", "JSON output")
      .action((ids: string[], o) =>
        withOps(async ({ ops }) => {
          const input = { operator: operatorFrom(o), reason: o.reason };
          printReport(
            verb === "replay" ? await ops.deadLetters.replay(ids, input) : await ops.deadLetters.discard(ids, input),
            o.json,
          );
        }),
      );
  }

  dlq
    .command("failed-after-replay")
    .description("replayed jobs that failed again (the replay-DLQ view), a page at a time")
    .option("--batch <id>", "only this batch")
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <cursor>", "continue from this cursor (printed at the end of a page)")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const page = await ops.deadLetters.failedAfterReplay(o.batch ? { batchId: o.batch } : {}, {
          limit: o.limit,
          ...(o.cursor ? { cursor: o.cursor } : {}),
        });
        if (o.json) {
          out(json(page));
          return;
        }
        out(
          table(page.items as unknown as Record<string, unknown>[], [
            "id",
            "createdAt",
            "batchId",
            "replayedFrom",
            "consumer",
            "errorClass",
            "lastError",
          ]),
        );
        // A page reads a bounded number of replayed letters, so it may be short (even empty) with more to come.
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  dlq
    .command("history <id>")
    .description("a letter's audit history, oldest first, a page at a time")
    .option("--limit <n>", "rows per page", "50")
    .option("--cursor <id>", "continue after this entry (printed at the end of a page)")
    .option("--json", "JSON output")
    .action((id, o) =>
      withOps(async ({ ops }) => {
        const page = await ops.deadLetters.history(id, { limit: o.limit, ...(o.cursor ? { cursor: o.cursor } : {}) });
        if (o.json) {
          out(json(page));
          return;
        }
        out(
          table(page.items as unknown as Record<string, unknown>[], ["at", "operator", "action", "result", "detail"]),
        );
        if (page.nextCursor) out(`more: --cursor ${page.nextCursor}`);
      }),
    );

  dlq
    .command("depth")
    .description("pending dead letters and the oldest age, per queue and consumer")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const items = await ops.deadLetters.depth();
        out(o.json ? json({ items }) : table(items, ["queue", "consumer", "pending", "oldestPendingAgeMs"]));
      }),
    );

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
    .option("--dry-run", "count what would be deleted, delete nothing")
    .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const retentionDays =
          o.retentionDays ?? process.env["SOFTCRUM_AUDIT_RETENTION_DAYS"] ?? DEFAULT_AUDIT_RETENTION_DAYS;
        const report = await ops.deadLetters.pruneAudit({
          operator: operatorFrom(o),
          retentionDays,
          dryRun: Boolean(o.dryRun),
        });
        out(
          o.json
            ? json(report)
            : `${report.dryRun ? "dry run: would delete" : "deleted"} ${report.deleted} audit entries older than ${report.cutoff.toISOString()} (${retentionDays} days)`,
        );
      }),
    );

  const batch = program.command("batch").description("replay batches");

  filterOptions(batch.command("create").description("select pending letters into a replay batch"))
    .requiredOption("--reason <text>", "why (recorded)")
    .requiredOption("--rate <perSecond>", "replays per second")
    .option("--batch-size <n>", "replays between checks of the stop conditions", "50")
    .option("--sample <n>", "replay this many first; continue only if none fails again")
    .option("--max-failure-rate <fraction>", "pause above this share of failed-again replays", "0.2")
    .option("--limit <n>", "at most this many letters (oldest first)")
    .option("--expires-in <minutes>", "the batch does not run after this", "1440")
    .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const created = await ops.batches.create({
          filter: filterFrom(o, false),
          operator: operatorFrom(o),
          reason: o.reason,
          ratePerSecond: o.rate,
          batchSize: o.batchSize,
          maxFailureRate: o.maxFailureRate,
          expiresInMinutes: o.expiresIn,
          ...(o.sample ? { sampleSize: o.sample } : {}),
          ...(o.limit ? { limit: o.limit } : {}),
        });
        printBatch(created, o.json);
        if (!o.json && created.status === "awaiting_approval") {
          out(
            `\n${created.selected} letters: another operator must approve: pnpm ops batch approve ${created.id} --operator NAME`,
          );
        }
      }),
    );

  batch
    .command("approve <id>")
    .description("approve a large batch (not your own)")
    .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
    .option("--json", "JSON output")
    .action((id, o) =>
      withOps(async ({ ops }) => printBatch(await ops.batches.approve(id, { operator: operatorFrom(o) }), o.json)),
    );

  for (const verb of ["pause", "resume", "stop"] as const) {
    batch
      .command(`${verb} <id>`)
      .description(
        verb === "stop"
          ? "stop for good"
          : verb === "pause"
            ? "pause; a running runner stops after its chunk"
            : "make a paused batch runnable again",
      )
      .requiredOption("--reason <text>", "why (recorded)")
      .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
      .option("--json", "JSON output")
      .action((id, o) =>
        withOps(async ({ ops }) =>
          printBatch(await ops.batches[verb](id, { operator: operatorFrom(o), reason: o.reason }), o.json),
        ),
      );
  }

  batch
    .command("run <id>")
    .description("replay the batch at its rate, with progress; Ctrl-C pauses it")
    .option("--operator <name>", "who (default $SOFTCRUM_OPERATOR)")
    .option("--no-progress", "no progress bar")
    .option("--json", "JSON output of the final state")
    .action((id, o) =>
      withOps(async ({ ops }) => {
        const operator = operatorFrom(o);
        const controller = new AbortController();
        const interrupt = () => controller.abort();
        process.once("SIGINT", interrupt);
        process.once("SIGTERM", interrupt);
        const bar = o.progress
          ? new SingleBar({
              format: "replay {bar} {value}/{total} | {rate}/s | ETA {etaText} | failed again {failedAgain} | {status}",
              stream: process.stderr,
              noTTYOutput: true,
              notTTYSchedule: 1000,
              hideCursor: true,
            })
          : undefined;
        let started = false;
        try {
          const final = await ops.batches.run(id, {
            operator,
            signal: controller.signal,
            onProgress: ({ batch: b, rate, etaSeconds }) => {
              const payload = {
                rate: rate.toFixed(1),
                etaText: `${Math.ceil(etaSeconds)}s`,
                failedAgain: b.failedAgain,
                status: b.status,
              };
              const done = b.replayed + b.skipped;
              if (!bar) return;
              if (!started) {
                bar.start(b.selected, done, payload);
                started = true;
              } else bar.update(done, payload);
            },
          });
          bar?.stop();
          printBatch(final, o.json);
          if (final.status !== "completed") process.exitCode = EXIT.partial;
        } finally {
          bar?.stop();
          process.off("SIGINT", interrupt);
          process.off("SIGTERM", interrupt);
        }
      }),
    );

  batch
    .command("show <id>")
    .description("a batch with live counts")
    .option("--json", "JSON output")
    .action((id, o) => withOps(async ({ ops }) => printBatch(await ops.batches.get(id), o.json)));

  batch
    .command("list")
    .description("recent batches")
    .option("--status <status>", "only this status")
    .option("--json", "JSON output")
    .action((o) =>
      withOps(async ({ ops }) => {
        const items = await ops.batches.list(o.status ? { status: o.status } : {});
        out(
          o.json
            ? json({ items })
            : table(items as unknown as Record<string, unknown>[], [
                "id",
                "status",
                "requestedBy",
                "approvedBy",
                "selected",
                "replayed",
                "failedAgain",
                "createdAt",
                "stopReason",
              ]),
        );
      }),
    );

  return program;
}

/** Runs the CLI and returns its exit code. */
export async function main(argv: string[]): Promise<number> {
  try {
    await buildProgram().parseAsync(argv, { from: "user" });
    return typeof process.exitCode === "number" ? process.exitCode : EXIT.ok;
  } catch (error) {
    if (error instanceof CommanderError) {
      return error.exitCode === 0 ? EXIT.ok : EXIT.usage; // commander printed the usage problem
    }
    if (error instanceof ExitError) {
      process.stderr.write(`error: ${error.message}\n`);
      return error.exitCode;
    }
    if (isSoftcrumError(error)) {
      process.stderr.write(`error: ${error.message}\n`);
      const byCode: Record<string, number> = {
        INVALID_INPUT: EXIT.usage,
        NOT_FOUND: EXIT.notFound,
        CONFLICT: EXIT.conflict,
        FORBIDDEN: EXIT.conflict,
        NOT_ROUTABLE: EXIT.conflict,
      };
      return byCode[error.code] ?? EXIT.failure;
    }
    process.stderr.write(`error: ${text(error instanceof Error ? error.message : error)}\n`);
    return EXIT.failure;
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  process.exitCode = await main(process.argv.slice(2));
}
