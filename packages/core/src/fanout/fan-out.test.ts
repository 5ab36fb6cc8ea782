/**
 * #20 item 3: per-tenant fan-out. A tick's jobs have job_ids derived from
 * (kind, tenant, tick) that are valid UUID v7s carrying the tick's time, so
 * the same tick run twice at once applies each tenant's job once (the fence);
 * tenants are read a page at a time; a publish the transport did not confirm
 * is published again, and a failed run is safe to run again.
 */
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { isJobId } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import type { QueuePort } from "../queue-port.ts";
import { fanOut } from "./fan-out.ts";
import { fanOutJobId } from "./job-id.ts";
import { tiersDue } from "./tiers.ts";

const pg = useEffectsDatabase("fan_out");

const TICK = new Date("2026-12-02T06:00:00.000Z");
const tenantIds = (n: number) => Array.from({ length: n }, (_, i) => `t-${String(i).padStart(6, "0")}`);
/** A keyset tenant source over a sorted list, recording the pages it served. */
function source(all: readonly string[]) {
  const pages: number[] = [];
  const read = async ({ after, limit }: { after: string | null; limit: number }) => {
    const start = after === null ? 0 : all.findIndex((t) => t > after);
    const page = start < 0 ? [] : all.slice(start, start + limit);
    pages.push(page.length);
    return page;
  };
  return { read, pages };
}

describe("fan-out job ids", () => {
  test("the same (kind, tenant, tick) gives the same job_id; it is a UUID v7 carrying the tick's time; any other input gives another", () => {
    const id = fanOutJobId({ kind: "tenant.snapshot.v1", tenantId: "acme", tick: TICK });
    expect(fanOutJobId({ kind: "tenant.snapshot.v1", tenantId: "acme", tick: new Date(TICK.getTime()) })).toBe(id);
    expect(isJobId(id)).toBe(true);
    expect(Number.parseInt(id.replaceAll("-", "").slice(0, 12), 16)).toBe(TICK.getTime());
    const others = [
      fanOutJobId({ kind: "tenant.snapshot.v2", tenantId: "acme", tick: TICK }),
      fanOutJobId({ kind: "tenant.snapshot.v1", tenantId: "acme2", tick: TICK }),
      fanOutJobId({ kind: "tenant.snapshot.v1", tenantId: "acme", tick: new Date(TICK.getTime() + 1) }),
    ];
    expect(new Set([id, ...others]).size).toBe(4);
    for (const o of others) expect(isJobId(o)).toBe(true);
    expect(() => fanOutJobId({ kind: "k", tenantId: "a", tick: new Date(Number.NaN) })).toThrow(InvalidConfigError);
    expect(() => fanOutJobId({ kind: "", tenantId: "a", tick: TICK })).toThrow(InvalidConfigError);
  });

  test("entitlement tiers due at a tick: every tier at midnight UTC, the finer ones at the other hours", () => {
    const at = (h: number) => tiersDue(new Date(Date.UTC(2026, 11, 2, h)));
    expect(at(0)).toEqual(["nightly", "12h", "6h", "3h", "1h"]);
    expect(at(12)).toEqual(["12h", "6h", "3h", "1h"]);
    expect(at(6)).toEqual(["6h", "3h", "1h"]);
    expect(at(9)).toEqual(["3h", "1h"]);
    expect(at(7)).toEqual(["1h"]);
    expect(() => tiersDue(new Date(Date.UTC(2026, 11, 2, 7, 30)))).toThrow(InvalidConfigError);
  });
});

describe("fanOut", () => {
  const snapshotConsumer = (name: string) =>
    defineConsumer({
      name,
      queue: `${name}.q`,
      kind: "tenant.snapshot.v1",
      schema: z.object({ tick: z.string() }),
      async handle(_data, { tx, envelope }) {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: 1 });
      },
    });

  test("the same tick run twice at once over 1,000 tenants, a page at a time: each tenant's job applied exactly once", async () => {
    const consumer = snapshotConsumer("fanout.snapshot");
    const queue = createMemoryQueue({ concurrency: 8 });
    try {
      queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
      const all = tenantIds(1_000);
      const a = source(all);
      const b = source(all);
      const run = (read: ReturnType<typeof source>["read"]) =>
        fanOut({
          queue,
          queueName: consumer.queue,
          kind: "tenant.snapshot.v1",
          tick: TICK,
          tenants: read,
          pageSize: 100,
        });
      const [first, second] = await Promise.all([run(a.read), run(b.read)]);
      await queue.drain();
      for (const report of [first, second]) {
        expect(report).toMatchObject({ tenants: 1_000, published: 1_000, unconfirmed: 0, failed: 0, pages: 11 });
      }
      expect(Math.max(...a.pages)).toBe(100);
      const [row] = await pg.sql<{ effects: number; jobs: number; fences: number }[]>`
        select (select count(*)::int from test_effects where consumer = ${consumer.name}) as effects,
               (select count(distinct job_id)::int from test_effects where consumer = ${consumer.name}) as jobs,
               (select count(*)::int from core.processed_jobs where consumer = ${consumer.name}) as fences`;
      expect(row).toEqual({ effects: 1_000, jobs: 1_000, fences: 1_000 });
      // The next tick is new work.
      await fanOut({
        queue,
        queueName: consumer.queue,
        kind: "tenant.snapshot.v1",
        tick: new Date(TICK.getTime() + 1_800_000),
        tenants: source(all).read,
        pageSize: 100,
      });
      await queue.drain();
      const [after] = await pg.sql<
        { n: number }[]
      >`select count(*)::int as n from test_effects where consumer = ${consumer.name}`;
      expect(after?.n).toBe(2_000);
    } finally {
      await queue.close();
    }
  });

  test("a publish only accepted is published again; one that keeps failing is reported, and running the tick again completes it with no job twice", async () => {
    const consumer = snapshotConsumer("fanout.flaky");
    const memory = createMemoryQueue({ concurrency: 4 });
    try {
      memory.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
      let unconfirmedLeft = 5;
      let broken = true;
      const flaky: QueuePort = {
        async publish(queueName, envelope, opts) {
          if (broken && envelope.tenant_id === "t-000007") throw new Error("503 Service Unavailable");
          const receipt = await memory.publish(queueName, envelope, opts);
          // Stored, but answered as a Vercel 202 the first few times.
          if (unconfirmedLeft > 0) {
            unconfirmedLeft -= 1;
            return { messageId: null, stored: false };
          }
          return receipt;
        },
        schedule: (q, e, at) => memory.schedule(q, e, at),
      };
      const all = tenantIds(20);
      const run = () =>
        fanOut({
          queue: flaky,
          queueName: consumer.queue,
          kind: "tenant.snapshot.v1",
          tick: TICK,
          tenants: source(all).read,
          pageSize: 8,
        });
      const first = await run();
      expect(first).toMatchObject({ tenants: 20, published: 19, unconfirmed: 0, failed: 1 });
      expect(first.failures).toEqual([{ tenantId: "t-000007", error: expect.stringContaining("503") }]);
      broken = false;
      expect(await run()).toMatchObject({ published: 20, failed: 0 });
      await memory.drain();
      const [row] = await pg.sql<{ effects: number; jobs: number }[]>`
        select count(*)::int as effects, count(distinct job_id)::int as jobs from test_effects where consumer = ${consumer.name}`;
      expect(row).toEqual({ effects: 20, jobs: 20 });
    } finally {
      await memory.close();
    }
  });

  test("bad options are refused before anything is published", async () => {
    const calls: string[] = [];
    const queue: QueuePort = {
      publish: async (q) => {
        calls.push(q);
        return { messageId: "x", stored: true };
      },
      schedule: async () => ({ messageId: "x", stored: true }),
    };
    const base = { queue, queueName: "q", kind: "k.v1", tick: TICK, tenants: async () => ["a"] };
    await expect(fanOut({ ...base, tick: new Date(Number.NaN) })).rejects.toThrow(InvalidConfigError);
    await expect(fanOut({ ...base, pageSize: 0 })).rejects.toThrow(InvalidConfigError);
    await expect(fanOut({ ...base, kind: "" })).rejects.toThrow();
    await expect(fanOut({ ...base, tenants: async () => ["a", "b"], pageSize: 1 })).rejects.toThrow(InvalidConfigError);
    expect(calls).toEqual([]);
  });
});
