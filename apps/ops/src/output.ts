// The CLI's exit codes and plain output (moved out of cli.ts): an action's
// report, one dead letter for people, rows with ages beside their timestamps.
import type { ActionReport, DeadLetterDetail } from "@softcrum/core/ops";
import { age, fields, humanMs, json, prettyPayload, type TableOptions, table, when } from "./format.ts";

export const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, conflict: 4, partial: 5 } as const;

export const out = (line: string) => process.stdout.write(`${line}\n`);
export const view = (o: { wide?: boolean }): TableOptions => (o.wide ? { wide: true } : {});
export const rowsOf = (items: object[]) => items as unknown as Record<string, unknown>[];

/** Rows with `age` beside their timestamp `key` (`3m 12s ago`), for people. */
export function withAge(items: object[], key: string, now = Date.now()): Record<string, unknown>[] {
  return rowsOf(items).map((row) => ({ ...row, age: age(row[key] as Date | null, now) }));
}

export function printReport(report: ActionReport, o: { json?: boolean; wide?: boolean }) {
  if (o.json) out(json(report));
  else {
    // The library's details count time in ms ("within 10000 ms"): human units here.
    const rows = report.results.map((r) => ({ ...r, detail: r.detail === undefined ? undefined : humanMs(r.detail) }));
    out(table(rows, ["id", "outcome", "detail"], view(o)));
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

const LETTER_FIELDS = [
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
  "age",
  "createdAt",
  "lastSeen",
  "statusChanged",
  "statusChangedBy",
  "statusReason",
  "replayBatchId",
];

/**
 * `dlq show` for people: the evidence with its times as ages (the
 * timestamps beside them), the last error, the payload pretty-printed, the
 * job's other failures and the letter's history.
 */
export function printLetter(d: DeadLetterDetail, o: { wide?: boolean }, now = Date.now()) {
  out(
    fields(
      {
        ...d,
        age: age(d.createdAt, now),
        lastSeen: when(d.lastSeenAt, now),
        statusChanged: when(d.statusChangedAt, now),
      },
      LETTER_FIELDS,
      view(o),
    ),
  );
  out(`\nlast error:\n  ${d.lastError}`);
  out(
    `\npayload (${d.payloadEncoding}, pretty-printed; --json has it as received):\n${indent(prettyPayload(d.payloadText))}`,
  );
  if (d.related.length) {
    const columns = ["id", "age", "errorClass", "status", "replayBatchId", "createdAt"];
    out(`\nrelated failures of this job:\n${table(withAge(d.related, "createdAt", now), columns, view(o))}`);
  }
  if (d.history.length) {
    const columns = ["at", "age", "operator", "action", "result", "detail"];
    out(`\nhistory:\n${table(withAge(d.history, "at", now), columns, view(o))}`);
  }
  if (d.historyNextCursor) out(`more history: pnpm ops dlq history ${d.id} --cursor ${d.historyNextCursor}`);
}

function indent(text: string): string {
  return text
    .split("\n")
    .map((line) => `  ${line}`)
    .join("\n");
}

/** What the replayed jobs did so far, in one line, with where to look again. */
export function replayOutcomeLine(outcomes: readonly { id: string; outcome: string }[]): string {
  const count = (o: string) => outcomes.filter((r) => r.outcome === o).length;
  const notYet = outcomes.find((r) => r.outcome === "not_yet");
  return (
    `so far: ${count("succeeded")} succeeded, ${count("duplicate")} already done, ${count("failed_again")} failed again, ${count("not_yet")} not yet` +
    (notYet ? ` (look again: pnpm ops dlq show ${notYet.id})` : "") +
    (count("unknown") > 0
      ? `, ${count("unknown")} unknown (replayed before the fence cleanup's horizon: look for their effects)`
      : "") +
    (count("failed_again") > 0 ? " — see pnpm ops dlq failed-after-replay" : "")
  );
}
