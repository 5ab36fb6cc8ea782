/**
 * The Upstash adapter of the lane backlog (#20 item 2; ADR 0011): one sorted
 * set per channel, `<prefix>:<channel>:transactional`, member the job_id,
 * score its due time — shared by every process and function instance that
 * uses the same Redis and prefix.
 *
 * - `add` is `ZADD NX`: a job published twice keeps one entry, its first due time.
 * - `remove` is `ZREM`: a job settled twice leaves once.
 * - `size` trims the entries more than `staleAfterMs` past due
 *   (`ZREMRANGEBYSCORE`), then counts the ones due by now (`ZCOUNT`).
 * - Every call is bounded by `timeoutMs` and throws on an error or no answer:
 *   the marketing consumer then defers (never reads an outage as "no backlog").
 */
import type { Redis } from "@upstash/redis";
import { InvalidConfigError } from "../errors.ts";
import { withinMs } from "../timers.ts";
import { checkRefreshMs, checkStaleAfterMs, DEFAULT_LANE_BACKLOG_STALE_AFTER_MS, type LaneBacklog } from "./backlog.ts";

export interface UpstashLaneBacklogOptions {
  /** An `@upstash/redis` client (`Redis.fromEnv()` on Vercel). */
  readonly redis: Redis;
  /** Prefix of every key; default `softcrum:lanes`. */
  readonly prefix?: string;
  /** Bound on each call, in ms; past it the call throws. @default 2000 */
  readonly timeoutMs?: number;
  /** @default DEFAULT_LANE_BACKLOG_STALE_AFTER_MS (15 min) */
  readonly staleAfterMs?: number;
  /** How long a consumer reuses a size it read. @default 100 */
  readonly refreshMs?: number;
  /** @default Date.now */
  readonly now?: () => number;
}

/** A call to Upstash failed or did not answer within `timeoutMs`. */
export class LaneBacklogUnavailableError extends Error {
  override readonly name = "LaneBacklogUnavailableError";
}

export const DEFAULT_UPSTASH_LANES_PREFIX = "softcrum:lanes";

export function upstashLaneBacklog(options: UpstashLaneBacklogOptions): LaneBacklog {
  const { redis } = options;
  if (typeof redis?.pipeline !== "function") {
    throw new InvalidConfigError("upstashLaneBacklog: redis must be an @upstash/redis client");
  }
  const prefix = options.prefix ?? DEFAULT_UPSTASH_LANES_PREFIX;
  const timeoutMs = options.timeoutMs ?? 2_000;
  const staleAfterMs = options.staleAfterMs ?? DEFAULT_LANE_BACKLOG_STALE_AFTER_MS;
  const refreshMs = options.refreshMs ?? 100;
  if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new InvalidConfigError("upstashLaneBacklog: timeoutMs must be a positive number of milliseconds");
  }
  checkStaleAfterMs(staleAfterMs, "upstashLaneBacklog");
  checkRefreshMs(refreshMs, "upstashLaneBacklog");
  const now = options.now ?? Date.now;
  const key = (channel: string) => `${prefix}:${channel}:transactional`;
  // An idle channel's set goes away on its own once every entry would be stale.
  const keyTtlMs = 2 * staleAfterMs;

  const bounded = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
    try {
      return await withinMs(
        work(),
        timeoutMs,
        () => new LaneBacklogUnavailableError(`lane backlog ${what}: no answer from Upstash within ${timeoutMs} ms`),
      );
    } catch (error) {
      if (error instanceof LaneBacklogUnavailableError) throw error;
      const message = error instanceof Error ? error.message : String(error);
      throw new LaneBacklogUnavailableError(`lane backlog ${what}: ${message}`, { cause: error });
    }
  };

  return {
    refreshMs,
    async add(channel, jobs) {
      if (jobs.length === 0) return;
      const [first, ...rest] = jobs.map((job) => ({ score: job.dueAt, member: job.jobId }));
      if (first === undefined) return;
      await bounded("add", () =>
        redis
          .pipeline()
          .zadd(key(channel), { nx: true }, first, ...rest)
          .pexpire(key(channel), keyTtlMs)
          .exec(),
      );
    },
    async remove(channel, jobId) {
      await bounded("remove", () => redis.zrem(key(channel), jobId));
    },
    async size(channel) {
      const at = now();
      const [, due] = await bounded("size", () =>
        redis
          .pipeline()
          .zremrangebyscore(key(channel), "-inf", `(${at - staleAfterMs}`)
          .zcount(key(channel), "-inf", at)
          .exec<[number, number]>(),
      );
      const count = Number(due);
      if (!Number.isInteger(count) || count < 0) {
        throw new LaneBacklogUnavailableError(`lane backlog size: unexpected answer ${JSON.stringify(due)}`);
      }
      return count;
    },
  };
}
