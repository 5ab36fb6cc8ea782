/**
 * The chaos run's check that attempts never run ahead of handler runs (#19):
 * from the workers' own records (each handler run appended before the work,
 * so a SIGKILL cannot erase it), the broker's events and the fake server's
 * sends.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import type { FakeVercelQueues } from "../test/fake-vercel-queues.ts";
import type { DeliveryRecord } from "./consumer.ts";
import { type BrokerEvent, jobIdIn } from "./hostile-broker.ts";

export interface AttemptsVerdict {
  /** Handler runs recorded, and the jobs they ran. */
  runs: number;
  jobs: number;
  /** Deliveries the run's own faults cost without a handler run, by cause. */
  credits: Record<string, number>;
  /** Handler runs given an attempt number above the runs so far (plus credits), and their jobs. */
  overRuns: number;
  overJobs: number;
  overJobIds: string[];
  problems: string[];
  /** A job's records, for the forensics of a failed run. */
  timeline(jobId: string): string;
}

/**
 * Attempts never above handler runs: a handler given attempt N means N - 1
 * earlier attempts of its job were spent, and each of those must have been a
 * run of the handler (counted by the workers as it starts, before the work:
 * a run the killer ended half-way still counts) — or a delivery the run's
 * own faults cost without a run, credited once each from the moment it
 * happened:
 * - `killed`: a lease a worker received, and the killer SIGKILLed it before
 *   the handler ran for it and before the adapter settled it (still in the
 *   adapter, in the harness before the handler started, or answered by the
 *   harness without a run — e.g. deferred — but not yet republished, held or
 *   acknowledged): the service counts that lease;
 * - `early-redelivery`: a lease the broker ended at once (another worker may
 *   receive the message, counted, before the first one's handler starts);
 * - `ack-dropped`: an acknowledgement the broker swallowed (the message comes
 *   back, counted, e.g. after a deferral that spent no attempt);
 * - `directive-failed`: a delivery that ran no handler, whose acknowledgement
 *   or visibility change failed (the adapter's delivery event says
 *   `applied: false`): it comes back when its lease ends, counted;
 * - `hold-unrecorded`: the adapter kept a delivery on its lease without
 *   spending an attempt but could not record (or read) that hold — the run's
 *   Postgres faults — and reported the incident it documents: that next
 *   delivery counts as an attempt.
 * A send answered 202 or 5xx earns no credit: a deferral whose copy is not
 * known stored keeps its original leased as a recorded hold, and that
 * original must not come back as a spent attempt (a retry that spent its
 * attempt comes back as the next one, which its run already counts).
 */
export function checkAttempts(
  fake: FakeVercelQueues,
  events: readonly BrokerEvent[],
  /** The workers' record files (one per worker process), and when the killer ended the process writing each. */
  runDir: string,
  killedAt: ReadonlyMap<string, number>,
): AttemptsVerdict {
  type Item = { t: number; run: true; a: number; where: string } | { t: number; run: false; why: string };
  const byJob = new Map<string, Item[]>();
  const add = (jobId: string, item: Item) => {
    const items = byJob.get(jobId) ?? [];
    items.push(item);
    byJob.set(jobId, items);
  };
  const credits: Record<string, number> = {};
  const credit = (jobId: string | undefined, t: number, why: string) => {
    if (jobId === undefined) return;
    credits[why] = (credits[why] ?? 0) + 1;
    add(jobId, { t, run: false, why });
  };
  // The message of a lease names its job (the fake stored it), and the
  // broker names the worker that received it (`/w/<index>.<generation>`).
  const jobOf = new Map<string, string>();
  for (const send of fake.sends) {
    const jobId = send.messageId === "" ? undefined : jobIdIn(send.body);
    if (jobId !== undefined) jobOf.set(send.messageId, jobId);
  }
  const leasesOf = new Map<string, Map<string, number>>(); // record file → message id → leases received
  for (const e of events) {
    if (e.type !== "received" || e.client === undefined || e.messageId === undefined) continue;
    const path = join(runDir, `worker-${e.client}.jsonl`);
    const leases = leasesOf.get(path) ?? new Map<string, number>();
    leases.set(e.messageId, (leases.get(e.messageId) ?? 0) + 1);
    leasesOf.set(path, leases);
  }
  let runs = 0;
  const files = new Set([...readdirSync(runDir).map((file) => join(runDir, file)), ...leasesOf.keys()]);
  for (const path of files) {
    const file = basename(path);
    /** The deliveries handed to the harness here, until the adapter settled them (its delivery event). */
    const deliveries = new Map<number, { job: string; msg: string; ran: boolean; settled: boolean }>();
    const unsettled = new Map<string, number[]>(); // message id → its deliveries not settled yet, oldest first
    /** Deliveries of each message this worker handed to the harness. */
    const handed = new Map<string, number>();
    const text = existsSync(path) ? readFileSync(path, "utf8") : "";
    for (const line of text.split("\n")) {
      if (line === "") continue;
      let rec: DeliveryRecord;
      try {
        rec = JSON.parse(line) as DeliveryRecord;
      } catch {
        continue; // a line cut short: only the last, and only if the write itself was
      }
      if (rec.e === "recv") {
        deliveries.set(rec.d, { job: rec.job, msg: rec.msg, ran: false, settled: false });
        unsettled.set(rec.msg, [...(unsettled.get(rec.msg) ?? []), rec.d]);
        handed.set(rec.msg, (handed.get(rec.msg) ?? 0) + 1);
      } else if (rec.e === "settled") {
        const d = unsettled.get(rec.msg)?.shift();
        const delivery = d !== undefined ? deliveries.get(d) : undefined;
        if (delivery === undefined) continue;
        delivery.settled = true;
        // Its acknowledgement or visibility change failed: it comes back, counted.
        if (!rec.applied && !delivery.ran) credit(delivery.job, rec.t, "directive-failed");
      } else if (rec.e === "incident") {
        if (rec.kind === "hold_unrecorded")
          credit(rec.job ?? (rec.msg !== undefined ? jobOf.get(rec.msg) : undefined), rec.t, "hold-unrecorded");
      } else if (rec.e === "run") {
        runs += 1;
        add(rec.job, { t: rec.t, run: true, a: rec.a, where: `${file}#${rec.d ?? "?"}` });
        // The delivery it ran for: its number when that delivery is of this
        // job, or the last one of the job not settled here. A batched
        // worker runs a batch's handlers in the async context of the
        // delivery that completed the batch: their number is another job's.
        const numbered = rec.d !== undefined ? deliveries.get(rec.d) : undefined;
        const delivery =
          numbered?.job === rec.job
            ? numbered
            : [...deliveries.values()].reverse().find((o) => o.job === rec.job && !o.settled && !o.ran);
        if (delivery) delivery.ran = true;
      }
    }
    const killed = killedAt.get(path);
    if (killed === undefined) continue;
    // Handed to the harness, and neither its handler started nor the
    // adapter's answer to the service made (a deferral's republish, its hold,
    // the acknowledgement) when the killer came.
    for (const delivery of deliveries.values()) {
      if (!delivery.ran && !delivery.settled) credit(delivery.job, killed, "killed");
    }
    // Received, and never handed to the harness.
    for (const [messageId, leases] of leasesOf.get(path) ?? []) {
      for (let i = handed.get(messageId) ?? 0; i < leases; i++) credit(jobOf.get(messageId), killed, "killed");
    }
  }
  for (const e of events) {
    const jobId = e.messageId !== undefined ? jobOf.get(e.messageId) : undefined;
    if (e.type === "early-redelivery" || e.type === "ack-dropped") credit(jobId, e.at, e.type);
  }
  const problems: string[] = [];
  const overJobIds: string[] = [];
  let overRuns = 0;
  let jobs = 0;
  for (const [jobId, items] of byJob) {
    // A credit at the same millisecond as a run came first.
    items.sort((x, y) => x.t - y.t || Number(x.run) - Number(y.run));
    let seen = 0;
    let credited = 0;
    let over = 0;
    let ran = false;
    for (const item of items) {
      if (!item.run) {
        credited += 1;
        continue;
      }
      ran = true;
      seen += 1;
      if (item.a > seen + credited) {
        over += 1;
        if (over === 1)
          problems.push(
            `attempt over runs: job ${jobId} was given attempt ${item.a} at its handler run ${seen} (${item.where}), with ${credited} deliveries credited to the run's faults`,
          );
      }
    }
    if (ran) jobs += 1;
    if (over > 0) {
      overRuns += over;
      overJobIds.push(jobId);
    }
  }
  return {
    runs,
    jobs,
    credits,
    overRuns,
    overJobs: overJobIds.length,
    overJobIds,
    problems,
    timeline: (jobId) => {
      const lines: unknown[] = [];
      for (const file of readdirSync(runDir)) {
        const path = join(runDir, file);
        const text = readFileSync(path, "utf8");
        if (!text.includes(jobId)) continue;
        const recs = text
          .split("\n")
          .filter((l) => l !== "")
          .map((l) => JSON.parse(l) as DeliveryRecord);
        const ds = new Set(recs.flatMap((r) => ((r.e === "recv" || r.e === "run") && r.job === jobId ? [r.d] : [])));
        const msgs = new Set(recs.flatMap((r) => (r.e === "recv" && r.job === jobId ? [r.msg] : [])));
        for (const r of recs) {
          const mine = r.e === "incident" ? r.job === jobId : r.e === "settled" ? msgs.has(r.msg) : ds.has(r.d);
          if (mine) lines.push({ file, ...r });
        }
        if (killedAt.has(path)) lines.push({ file, killedAt: killedAt.get(path) });
      }
      return JSON.stringify({ jobId, records: lines, credits: byJob.get(jobId)?.filter((i) => !i.run) });
    },
  };
}
