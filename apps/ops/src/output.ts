// The CLI's exit codes and plain output (moved out of cli.ts).
import type { ActionReport } from "@softcrum/core/ops";
import { json, type TableOptions, table } from "./format.ts";

export const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, conflict: 4, partial: 5 } as const;

export const out = (line: string) => process.stdout.write(`${line}\n`);
export const view = (o: { wide?: boolean }): TableOptions => (o.wide ? { wide: true } : {});
export const rowsOf = (items: object[]) => items as unknown as Record<string, unknown>[];

export function printReport(report: ActionReport, o: { json?: boolean; wide?: boolean }) {
  if (o.json) out(json(report));
  else {
    out(table(rowsOf(report.results), ["id", "outcome", "detail"], view(o)));
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
