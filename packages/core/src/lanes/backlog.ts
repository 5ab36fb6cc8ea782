/**
 * The transactional backlog of a channel (#20 item 2, SPEC §7; ADR 0011):
 * the jobs published on `notif.{channel}.transactional` that have not reached
 * a final outcome yet. A marketing consumer of the channel yields while it is
 * above its threshold, so transactional always wins — across processes when
 * the backlog lives in Redis (`upstashLaneBacklog`), in one with
 * `inProcessLaneBacklog`.
 *
 * It is a set of job_ids, not a counter: a job published twice, or settled
 * twice (a duplicate delivery, two consumers), counts once and leaves once,
 * so duplicates — which an at-least-once transport makes normal — cannot make
 * it drift. What remains is a job whose final outcome is never recorded (a
 * transport that lost it, a process killed between COMMIT and the removal
 * whose copy never comes back): an entry older than `staleAfterMs` past its
 * due time no longer counts, and is trimmed.
 */
import { InvalidConfigError } from "../errors.ts";

export interface LaneBacklogEntry {
  readonly jobId: string;
  /** When the job becomes deliverable, ms since the epoch: it counts from then (a job scheduled ahead is not backlog yet). */
  readonly dueAt: number;
}

export interface LaneBacklog {
  /**
   * How long a consumer may reuse a `size()` it read, in ms: the yield reacts
   * this much later, and the store is asked at most once per interval per
   * consumer instead of once per delivery.
   */
  readonly refreshMs: number;
  /** Puts jobs into `channel`'s transactional backlog; a job already there keeps its entry. */
  add(channel: string, jobs: readonly LaneBacklogEntry[]): Promise<void>;
  /** Takes a job out (it reached a final outcome); a job not there is no error. */
  remove(channel: string, jobId: string): Promise<void>;
  /**
   * How many jobs of `channel`'s transactional backlog are due now and not
   * stale. Throws when the store cannot answer: the caller defers, it never
   * reads a failure as an empty backlog.
   */
  size(channel: string): Promise<number>;
}

/** After this long past its due time an entry no longer counts (ADR 0011). */
export const DEFAULT_LANE_BACKLOG_STALE_AFTER_MS = 15 * 60_000;

export interface InProcessLaneBacklogOptions {
  /** @default DEFAULT_LANE_BACKLOG_STALE_AFTER_MS (15 min) */
  readonly staleAfterMs?: number;
  /** @default 10 */
  readonly refreshMs?: number;
  /** @default Date.now */
  readonly now?: () => number;
}

export function checkStaleAfterMs(staleAfterMs: number, owner: string): void {
  if (!(Number.isFinite(staleAfterMs) && staleAfterMs >= 1_000)) {
    throw new InvalidConfigError(`${owner}: staleAfterMs must be a number of milliseconds, at least 1000`);
  }
}

export function checkRefreshMs(refreshMs: number, owner: string): void {
  if (!(Number.isFinite(refreshMs) && refreshMs >= 0 && refreshMs <= 60_000)) {
    throw new InvalidConfigError(`${owner}: refreshMs must be a number of milliseconds from 0 to 60000`);
  }
}

/** The backlog of one process: for the embedded demo, tests, and a single worker. */
export function inProcessLaneBacklog(options: InProcessLaneBacklogOptions = {}): LaneBacklog {
  const staleAfterMs = options.staleAfterMs ?? DEFAULT_LANE_BACKLOG_STALE_AFTER_MS;
  const refreshMs = options.refreshMs ?? 10;
  checkStaleAfterMs(staleAfterMs, "inProcessLaneBacklog");
  checkRefreshMs(refreshMs, "inProcessLaneBacklog");
  const now = options.now ?? Date.now;
  const channels = new Map<string, Map<string, number>>();
  return {
    refreshMs,
    async add(channel, jobs) {
      let entries = channels.get(channel);
      if (entries === undefined) {
        entries = new Map();
        channels.set(channel, entries);
      }
      for (const job of jobs) if (!entries.has(job.jobId)) entries.set(job.jobId, job.dueAt);
    },
    async remove(channel, jobId) {
      channels.get(channel)?.delete(jobId);
    },
    async size(channel) {
      const entries = channels.get(channel);
      if (entries === undefined) return 0;
      const at = now();
      let due = 0;
      for (const [jobId, dueAt] of entries) {
        if (dueAt < at - staleAfterMs) entries.delete(jobId);
        else if (dueAt <= at) due += 1;
      }
      return due;
    },
  };
}
