// `batch` output and `batch run` (moved out of cli.ts): a batch for people, the
// --rate flag, and the runner with its progress bar or NDJSON events.
import type { BatchView, Ops, SampleReport } from "@softcrum/core/ops";
import { SingleBar } from "cli-progress";
import {
  duration,
  etaText,
  fields,
  humanMs,
  json,
  ndjson,
  ProgressLines,
  phaseOf,
  relative,
  table,
  when,
} from "./format.ts";
import { EXIT, out, rowsOf, view } from "./output.ts";

const BATCH_FIELDS = [
  "id",
  "status",
  "filter",
  "reason",
  "requestedBy",
  "approvedBy",
  "consumers",
  "ratePerSecond",
  "rateShare",
  "rateFloor",
  "batchSize",
  "sampleSize",
  "maxFailureRate",
  "maxDuplicateRate",
  "maxRateLimitedMultiple",
  "maxLatencyMultiple",
  "selected",
  "replayed",
  "skipped",
  "succeeded",
  "duplicates",
  "failedAgain",
  "unresolved",
  "pending",
  "recovery",
  "created",
  "approved",
  "started",
  "ended",
  "ran",
  "expires",
  "lease",
  "stopReason",
];

/** A batch for people: counts, and times as ages and durations (timestamps beside them), never milliseconds. */
export function humanBatch(batch: BatchView, now = Date.now()): Record<string, unknown> {
  const ended = batch.endedAt?.getTime() ?? now;
  const lease = batch.leaseExpiresAt?.getTime();
  return {
    ...batch,
    created: when(batch.createdAt, now),
    approved: when(batch.approvedAt, now),
    started: batch.startedAt ? when(batch.startedAt, now) : "not yet",
    ended: when(batch.endedAt, now),
    // Who runs it now (one runner at a time), until the heartbeat stops renewing it.
    lease:
      batch.leaseOwner && lease !== undefined
        ? `${batch.leaseOwner}, ${lease > now ? `expires ${relative(batch.leaseExpiresAt, now)}` : `lapsed ${relative(batch.leaseExpiresAt, now)}: another runner may take over`}`
        : "none",
    stopReason: batch.stopReason === null ? null : humanMs(batch.stopReason),
    ran: batch.startedAt
      ? `${duration(ended - batch.startedAt.getTime())}${batch.endedAt ? "" : " so far"}`
      : "not yet",
    // Done only when every replayed job resolved (#21 item 7): succeeded + duplicates + failed again = replayed.
    recovery: batch.recovered
      ? `done: ${batch.succeeded} succeeded, ${batch.duplicates} already done, ${batch.failedAgain} failed again${batch.timeToRecoveryMs !== null ? ` in ${duration(batch.timeToRecoveryMs)}` : ""}`
      : `not yet: ${batch.unresolved} replayed jobs unresolved, ${batch.pending} letters to replay`,
    expires: `${batch.expiresAt.getTime() > now ? "" : "expired "}${when(batch.expiresAt, now)}`,
    // The versions it was made (and approved) for; it runs against no other (#21 item 6).
    consumers: batch.consumerVersions
      ? Object.entries(batch.consumerVersions)
          .map(([key, v]) => `${key.replace(" ", "/")} @ ${v.version} (${v.kinds.join(", ")})`)
          .join("; ")
      : "no version reported",
  };
}

export function printBatch(batch: BatchView, o: { json?: boolean; wide?: boolean }) {
  if (o.json) out(json(batch));
  else out(fields(humanBatch(batch), BATCH_FIELDS, view(o)));
}

/** `--rate 10` is 10 replays a second; `--rate 10%` paces at 10 % of live traffic, between --rate-floor and --rate-ceiling. */
export function rateOptions(o: { rate: string; rateFloor: string; rateCeiling: string }) {
  const share = /^\s*([\d.]+)\s*%\s*$/.exec(o.rate);
  if (!share) return { ratePerSecond: o.rate };
  return {
    rateShareOfLive: Number(share[1]) / 100,
    rateFloorPerSecond: o.rateFloor,
    ratePerSecond: o.rateCeiling,
  };
}

/**
 * Runs a batch with a progress bar on stderr (or NDJSON events on stdout with
 * --json). Between the runner's own reports it looks at the batch every
 * second, so the bar also says when it waits for the sample check.
 */
export async function runBatch(
  ops: Ops,
  operator: string,
  id: string,
  o: { progress: boolean; json?: boolean; wide?: boolean; continueAfterSample?: boolean },
) {
  const controller = new AbortController();
  const interrupt = () => controller.abort();
  process.once("SIGINT", interrupt);
  process.once("SIGTERM", interrupt);
  // The rate shown is this run's: replays since it started, over the time since.
  const before = await ops.batches.get(id).catch(() => undefined);
  const startedAt = Date.now();
  let startCount = before ? before.replayed + before.skipped : undefined;
  // A bar on a terminal; otherwise a line now and then (a log file is not a terminal).
  const terminal = process.stderr.isTTY === true;
  const bar =
    o.progress && !o.json && terminal
      ? new SingleBar({
          format: "replay {bar} {value}/{total} | {rate}/s | ETA {etaText} | failed again {failedAgain} | {phase}",
          stream: process.stderr,
          hideCursor: true,
        })
      : undefined;
  const lines =
    o.progress && !o.json && !terminal ? new ProgressLines((line) => process.stderr.write(`${line}\n`)) : undefined;
  let barStarted = false;
  // The rate the runner paces at (a share of live traffic moves it below the
  // batch's ceiling): the ETA and the phase use it once the runner reports it.
  let pacedPerSecond: number | undefined;
  const show = (b: BatchView) => {
    const done = b.replayed + b.skipped;
    startCount ??= done;
    const elapsed = Math.max(0.001, (Date.now() - startedAt) / 1000);
    const rate = (done - startCount) / elapsed;
    const paced = { ...b, ratePerSecond: pacedPerSecond ?? b.ratePerSecond };
    const etaSeconds = b.pending / paced.ratePerSecond;
    const phase = phaseOf(paced);
    if (o.json) {
      out(
        ndjson({
          event: "progress",
          at: new Date().toISOString(),
          batchId: b.id,
          status: b.status,
          phase,
          selected: b.selected,
          replayed: b.replayed,
          skipped: b.skipped,
          pending: b.pending,
          succeeded: b.succeeded,
          duplicates: b.duplicates,
          failedAgain: b.failedAgain,
          unresolved: b.unresolved,
          recovered: b.recovered,
          rate: Number(rate.toFixed(2)),
          etaSeconds: Math.ceil(etaSeconds),
        }),
      );
      return;
    }
    if (!bar && !lines) return;
    const payload = {
      rate: rate.toFixed(1),
      etaText: etaText(etaSeconds),
      failedAgain: b.failedAgain,
      phase,
    };
    if (lines) lines.update(b.selected, done, payload);
    else if (!barStarted) {
      bar?.start(b.selected, done, payload);
      barStarted = true;
    } else bar?.update(done, payload);
  };
  let running = true;
  const poll = (async () => {
    while (running) {
      await new Promise((resolve) => setTimeout(resolve, 1000).unref());
      if (!running) break;
      const b = await ops.batches.get(id).catch(() => undefined);
      if (b && running) show(b);
    }
  })();
  try {
    const final = await ops.batches.run(id, {
      operator,
      signal: controller.signal,
      onProgress: ({ batch: b, pacedPerSecond: paced }) => {
        pacedPerSecond = paced;
        show(b);
      },
      // The sample's outcomes beside the selection's classes, then a person's yes (#21 item 7).
      confirmSample: async (report) => {
        bar?.stop();
        barStarted = false;
        if (o.json) out(ndjson({ event: "sample", ...report }));
        else out(sampleText(report, o));
        if (o.continueAfterSample) return true;
        if (o.json || !process.stdin.isTTY || !terminal) {
          if (!o.json) {
            out(
              `\npaused for review (no terminal to ask on): pnpm ops batch resume ${id} --reason "…" then pnpm ops batch run ${id}, or run it with --continue-after-sample`,
            );
          }
          return false;
        }
        return ask(`continue with the other ${report.remaining} letters? [y/N] `);
      },
    });
    running = false;
    bar?.stop();
    lines?.finish();
    if (o.json) out(ndjson({ event: "result", batch: final }));
    else printBatch(final, o);
    if (final.status !== "completed") process.exitCode = EXIT.partial;
  } finally {
    running = false;
    await poll;
    bar?.stop();
    process.off("SIGINT", interrupt);
    process.off("SIGTERM", interrupt);
  }
}

/** The sample job by job (what the letter failed with, what its replay did) and the selection's classes. */
export function sampleText(report: SampleReport, o: { wide?: boolean } = {}): string {
  const rows = report.items.map((i) => ({
    id: i.deadLetterId,
    errorClass: i.errorClass,
    outcome: i.outcome,
    now: i.newErrorClass ? `${i.newErrorClass}: ${i.newError ?? ""}` : "",
    lastError: i.lastError,
  }));
  const selection = Object.entries(report.selection)
    .map(([cls, n]) => `${cls} ${n}`)
    .join(", ");
  return [
    `sample: ${report.items.length} replayed, every outcome in`,
    table(rowsOf(rows), ["id", "errorClass", "outcome", "now", "lastError"], view(o)),
    `selection by error class: ${selection}; ${report.remaining} letters left after the sample`,
  ].join("\n");
}

/** A yes/no on the terminal; anything but y/yes is no. */
async function ask(question: string): Promise<boolean> {
  const { createInterface } = await import("node:readline/promises");
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^\s*y(es)?\s*$/i.test(await rl.question(question));
  } finally {
    rl.close();
  }
}
