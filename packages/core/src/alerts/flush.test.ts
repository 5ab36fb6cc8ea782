// BoundConsumer.flushAlerts (#9 item 8): what a serverless transport awaits before it answers.
import { useTestDatabase } from "@softcrum/testing";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { silentLogger } from "../../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { PermanentError } from "../errors.ts";
import type { AlertPort, DeadLetterAlert } from "../ports/alerts.ts";

const pg = useTestDatabase("alert_flush");

/** An alert sink whose deliveries and flushes finish when the test says so. */
function controlledAlerts() {
  const events: string[] = [];
  const pending: (() => void)[] = [];
  const later = (label: string) =>
    new Promise<void>((resolve) => {
      pending.push(() => {
        events.push(`${label} done`);
        resolve();
      });
    });
  const port: AlertPort = {
    deadLetterCreated(alert: DeadLetterAlert) {
      events.push(`alert ${alert.errorClass}`);
      return later("alert");
    },
    flush() {
      events.push("flush");
      return later("flush");
    },
  };
  const finishNext = () => pending.shift()?.();
  return { port, events, finishNext, pending };
}

let seq = 0;
function refusing(alerts: AlertPort) {
  seq += 1;
  const consumer = defineConsumer({
    name: `flush.c${seq}`,
    queue: `flush.q${seq}`,
    kind: "flush.v1",
    schema: z.object({ ok: z.boolean() }),
    handle: async (data) => {
      if (!data.ok) throw new PermanentError("refused");
    },
  });
  const bound = bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger });
  const deliver = (ok: boolean) =>
    bound.deliver({
      body: JSON.stringify(createEnvelope({ tenantId: "acme", kind: "flush.v1", data: { ok } })),
      deliveryCount: 1,
    });
  return { bound, deliver };
}

describe("BoundConsumer.flushAlerts (#9 item 8)", () => {
  test("waits for the letter's alert and then the port's flush; with no letter since, it does nothing (#9 item 8)", async () => {
    const alerts = controlledAlerts();
    const { bound, deliver } = refusing(alerts.port);
    await deliver(true);
    await bound.flushAlerts?.();
    expect(alerts.events).toEqual([]); // a request that wrote no letter pays nothing

    expect(await deliver(false)).toMatchObject({ outcome: "dead_lettered" });
    let flushed = false;
    const flushing = bound.flushAlerts?.().then(() => {
      flushed = true;
    });
    alerts.finishNext(); // the alert is delivered…
    await new Promise((resolve) => setImmediate(resolve));
    expect(alerts.events).toEqual(["alert permanent", "alert done", "flush"]);
    expect(flushed).toBe(false); // …but the flush is not done yet
    alerts.finishNext();
    await flushing;
    expect(alerts.events).toEqual(["alert permanent", "alert done", "flush", "flush done"]);
  });

  test("a request whose alert another request's flush took still waits for that flush (#9 item 8)", async () => {
    const alerts = controlledAlerts();
    const { bound, deliver } = refusing(alerts.port);
    await deliver(false); // request A writes a letter
    alerts.finishNext();
    // Request B (it wrote nothing) answers first and flushes A's alert with its own call.
    const b = bound.flushAlerts?.();
    let aDone = false;
    const a = bound.flushAlerts?.().then(() => {
      aDone = true;
    });
    await new Promise((resolve) => setImmediate(resolve));
    expect(alerts.events).toEqual(["alert permanent", "alert done", "flush"]);
    expect(aDone).toBe(false);
    alerts.finishNext();
    await Promise.all([a, b]);
    expect(aDone).toBe(true);
    expect(alerts.events.filter((e) => e === "flush")).toHaveLength(1);
  });
});
