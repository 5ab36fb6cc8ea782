/**
 * #20 item 3: the fan-out's entry points. The cron route answers only a GET
 * with the right bearer token (compared in constant time), audits every call,
 * and fans out the tick the call falls in, so a retried cron publishes the
 * same jobs; the schedule loop runs each tick boundary once, in order.
 */
import { describe, expect, test } from "vitest";
import { useEffectsDatabase } from "../../test/fixtures.ts";
import type { Envelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";
import type { QueuePort } from "../queue-port.ts";
import { type FanOutTask, fanOutCronRoute, scheduleFanOut, tickAt } from "./entry-points.ts";

const pg = useEffectsDatabase("fan_out_routes", "core.ops_audit");
const SECRET = "cron-secret-of-at-least-16";

function recordingQueue() {
  const sent: Envelope[] = [];
  const queue: QueuePort = {
    publish: async (_q, envelope) => {
      sent.push(envelope);
      return { messageId: envelope.job_id, stored: true };
    },
    schedule: async (_q, envelope) => ({ messageId: envelope.job_id, stored: true }),
  };
  return { queue, sent };
}

const task = (everyMs = 1_800_000): FanOutTask => ({
  name: "snapshots.consumption",
  queueName: "data.snapshots",
  kind: "tenant.snapshot.v1",
  everyMs,
  tenants: async ({ after }) => (after === null ? ["acme", "globex"] : []),
});

describe("the cron route", () => {
  test("refuses anything but a GET with the right bearer token, audits each call, and fans out the tick the call falls in — the same jobs when called again", async () => {
    const { queue, sent } = recordingQueue();
    let now = Date.UTC(2026, 11, 2, 6, 17);
    const route = fanOutCronRoute({ task: task(), queue, secret: SECRET, audit: pg.db, clock: { now: () => now } });
    const call = (init: RequestInit) => route(new Request("http://app.invalid/api/cron/snapshots", init));
    expect((await call({ method: "POST", headers: { authorization: `Bearer ${SECRET}` } })).status).toBe(405);
    expect((await call({ method: "GET" })).status).toBe(401);
    expect((await call({ method: "GET", headers: { authorization: `Bearer ${SECRET}x` } })).status).toBe(401);
    expect((await call({ method: "GET", headers: { authorization: SECRET } })).status).toBe(401);
    expect(sent).toEqual([]);
    const ok = await call({ method: "GET", headers: { authorization: `Bearer ${SECRET}` } });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ tick: "2026-12-02T06:00:00.000Z", tenants: 2, published: 2 });
    now += 60_000; // a retried cron, within the same tick
    expect((await call({ method: "GET", headers: { authorization: `Bearer ${SECRET}` } })).status).toBe(200);
    expect(sent).toHaveLength(4);
    expect(sent[2]?.job_id).toBe(sent[0]?.job_id);
    expect(sent[3]?.job_id).toBe(sent[1]?.job_id);
    const rows = await pg.sql<{ operator: string; action: string; result: string }[]>`
      select operator, action, result from core.ops_audit order by id`;
    expect(rows.map((r) => r.result)).toEqual(["refused", "refused", "refused", "refused", "ok", "ok"]);
    expect(new Set(rows.map((r) => `${r.operator} ${r.action}`))).toEqual(
      new Set(["cron fanout.snapshots.consumption"]),
    );
  });

  test("a route without a CRON_SECRET of at least 16 characters is refused when it is made", () => {
    const { queue } = recordingQueue();
    expect(() => fanOutCronRoute({ task: task(), queue, env: {} })).toThrow(InvalidConfigError);
    expect(() => fanOutCronRoute({ task: task(), queue, secret: "short" })).toThrow(InvalidConfigError);
    expect(() => fanOutCronRoute({ task: task(), queue, env: { CRON_SECRET: SECRET } })).not.toThrow();
  });
});

describe("the schedule loop", () => {
  test("runs each tick boundary once, in order, and stops", async () => {
    const { queue } = recordingQueue();
    const ticks: string[] = [];
    let resolveTwo: () => void = () => {};
    const two = new Promise<void>((resolve) => {
      resolveTwo = resolve;
    });
    const loop = scheduleFanOut(task(1_000), {
      queue,
      onRun: (report) => {
        ticks.push(report.tick);
        if (ticks.length === 2) resolveTwo();
      },
    });
    await two;
    await loop.stop();
    const [a, b] = ticks.map((t) => Date.parse(t));
    expect(a).toBe(tickAt(a as number, 1_000).getTime());
    expect((b as number) - (a as number)).toBe(1_000);
  });
});
