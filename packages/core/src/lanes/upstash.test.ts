// The Upstash lane backlog (#20 item 2, ADR 0011) through the real
// `@upstash/redis` client, against the loopback REST shim in front of the
// local Redis (test/upstash-shim.ts); and a marketing consumer yielding to a
// transactional backlog that another process fills and drains.
import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Redis } from "@upstash/redis";
import { sql } from "drizzle-orm";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { startUpstashShim, type UpstashShim } from "../../test/upstash-shim.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import { laneQueue } from "./names.ts";
import { LaneBacklogUnavailableError, upstashLaneBacklog } from "./upstash.ts";

const pg = useEffectsDatabase("lanes_upstash", "test_effects, core.processed_jobs, core.dead_letters, lane_runs");
let shim: UpstashShim;
const run = `softcrum-test:lanes:${randomUUID()}`;
let tests = 0;
const freshPrefix = () => `${run}:${++tests}`;
const client = () => new Redis({ url: shim.url, token: shim.token, retry: false });
const MARKETING = laneQueue("email", "marketing");

beforeAll(async () => {
  shim = await startUpstashShim();
  await pg.sql`create table lane_runs (lane text not null, at timestamptz not null default clock_timestamp())`;
});

afterEach(() => {
  shim.down(false);
  shim.hang(false);
});

afterAll(async () => {
  if (!shim) return;
  await shim.deleteKeys(`${run}:*`);
  await shim.close();
});

describe("upstashLaneBacklog", () => {
  test("a set of job_ids per channel: a job added twice counts once (its first due time), removed twice leaves once; only due, non-stale entries count", async () => {
    let now = 1_700_000_000_000;
    const prefix = freshPrefix();
    const backlog = upstashLaneBacklog({ redis: client(), prefix, staleAfterMs: 60_000, now: () => now });
    const other = upstashLaneBacklog({ redis: client(), prefix, staleAfterMs: 60_000, now: () => now });
    await backlog.add("email", [
      { jobId: "a", dueAt: now - 10 },
      { jobId: "b", dueAt: now },
      { jobId: "later", dueAt: now + 5_000 },
    ]);
    await other.add("email", [{ jobId: "a", dueAt: now + 9_999 }]); // a second publish of "a": keeps its first due time
    await backlog.add("sms", [{ jobId: "s", dueAt: now }]);
    expect(await other.size("email")).toBe(2);
    expect(await backlog.size("sms")).toBe(1);
    now += 5_000;
    expect(await backlog.size("email")).toBe(3);
    await backlog.remove("email", "a");
    await other.remove("email", "a");
    await backlog.remove("email", "never-added");
    expect(await backlog.size("email")).toBe(2);
    // 60 s past their due time the rest no longer count, and are trimmed from Redis.
    now += 60_001;
    expect(await backlog.size("email")).toBe(0);
    expect(await client().zcard(`${prefix}:email:transactional`)).toBe(0);
  });

  test("an outage or a hanging Upstash is an error, never an empty backlog; it answers again when Upstash does", async () => {
    const backlog = upstashLaneBacklog({ redis: client(), prefix: freshPrefix(), timeoutMs: 300 });
    await backlog.add("email", [{ jobId: "x", dueAt: Date.now() - 1 }]);
    shim.down(true);
    await expect(backlog.size("email")).rejects.toBeInstanceOf(LaneBacklogUnavailableError);
    await expect(backlog.add("email", [{ jobId: "y", dueAt: 0 }])).rejects.toBeInstanceOf(LaneBacklogUnavailableError);
    shim.down(false);
    shim.hang(true);
    await expect(backlog.size("email")).rejects.toThrow(/no answer from Upstash within 300 ms/);
    shim.hang(false);
    expect(await backlog.size("email")).toBe(1);
  });

  test("bad options are refused at start", () => {
    expect(() => upstashLaneBacklog({ redis: {} as Redis })).toThrow(InvalidConfigError);
    expect(() => upstashLaneBacklog({ redis: client(), timeoutMs: 0 })).toThrow(InvalidConfigError);
    expect(() => upstashLaneBacklog({ redis: client(), staleAfterMs: 5 })).toThrow(InvalidConfigError);
  });
});

describe("a marketing consumer with the Upstash backlog", () => {
  test("Upstash down: the marketing delivery is deferred (no attempt), and runs once it is back", async () => {
    const backlog = upstashLaneBacklog({ redis: client(), prefix: freshPrefix(), timeoutMs: 300, refreshMs: 0 });
    let runs = 0;
    const consumer = defineConsumer({
      name: "lanes.upstash-outage",
      queue: MARKETING,
      kind: "email.send.v1",
      schema: z.object({ n: z.number().int() }),
      handle: async () => {
        runs += 1;
      },
    });
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, laneBacklog: backlog });
    const body = JSON.stringify(createEnvelope({ tenantId: "t", kind: "email.send.v1", data: { n: 1 } }));
    shim.down(true);
    expect(await bound.deliver({ body, deliveryCount: 1 })).toMatchObject({
      outcome: "deferred",
      spendsAttempt: false,
    });
    shim.down(false);
    shim.hang(true);
    expect(await bound.deliver({ body, deliveryCount: 1, deferrals: 1 })).toMatchObject({ outcome: "deferred" });
    shim.hang(false);
    expect(await bound.deliver({ body, deliveryCount: 1, deferrals: 2 })).toMatchObject({ outcome: "success" });
    expect(runs).toBe(1);
  });

  test("across processes: no marketing job commits before the last transactional job another process published has committed", async () => {
    const prefix = freshPrefix();
    const TRANSACTIONAL_JOBS = 40;
    const MARKETING_JOBS = 20;
    const script = fileURLToPath(new URL("../../test/lane-transactional-worker.ts", import.meta.url));
    let child: ChildProcess | undefined;
    const queue = createMemoryQueue({ concurrency: 4 });
    try {
      child = spawn(
        process.execPath,
        ["--import", "tsx", script, pg.url, shim.url, shim.token, prefix, String(TRANSACTIONAL_JOBS)],
        { cwd: fileURLToPath(new URL("../..", import.meta.url)), stdio: ["ignore", "pipe", "pipe"] },
      );
      let output = "";
      let errors = "";
      child.stderr?.on("data", (chunk) => {
        errors += chunk;
      });
      const exited = new Promise<number | null>((resolve) => child?.on("exit", resolve));
      await new Promise<void>((resolve, reject) => {
        child?.stdout?.on("data", (chunk) => {
          output += chunk;
          if (output.includes("PUBLISHED")) resolve();
        });
        void exited.then((code) => reject(new Error(`worker exited (${code}) before publishing: ${output}${errors}`)));
      });

      // This process's marketing consumer, with a client of its own, starts only now.
      const backlog = upstashLaneBacklog({ redis: client(), prefix, refreshMs: 0 });
      const consumer = defineConsumer({
        name: "lanes.marketing-parent",
        queue: MARKETING,
        kind: "email.send.v1",
        schema: z.object({ n: z.number().int() }),
        handle: async (_data, { tx }) => {
          await tx.execute(sql`insert into lane_runs (lane) values ('marketing')`);
        },
      });
      queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger, laneBacklog: backlog }));
      for (let n = 0; n < MARKETING_JOBS; n++) {
        await queue.publish(MARKETING, createEnvelope({ tenantId: "t", kind: "email.send.v1", data: { n } }));
      }
      expect(await exited).toBe(0);
      expect(output).toContain("DONE");
      await queue.drain();

      const [row] = await pg.sql<{ t: number; m: number; ordered: boolean }[]>`
        select count(*) filter (where lane = 'transactional')::int as t,
               count(*) filter (where lane = 'marketing')::int as m,
               max(at) filter (where lane = 'transactional') < min(at) filter (where lane = 'marketing') as ordered
        from lane_runs`;
      expect(row).toEqual({ t: TRANSACTIONAL_JOBS, m: MARKETING_JOBS, ordered: true });
      expect(await backlog.size("email")).toBe(0);
    } finally {
      child?.kill("SIGKILL");
      await queue.close();
    }
  }, 60_000);
});
