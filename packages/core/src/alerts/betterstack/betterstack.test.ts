import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { gunzipSync } from "node:zlib";
import { decode } from "@msgpack/msgpack";
import { useTestDatabase } from "@softcrum/testing";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { recordingMetrics, silentLogger } from "../../../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { createEnvelope } from "../../envelope.ts";
import { PermanentError } from "../../errors.ts";
import type { DeadLetterAlert } from "../../ports/alerts.ts";
import { createBetterStackAlerts, errorFingerprint } from "./index.ts";

const pg = useTestDatabase("betterstack");

/** A BetterStack ingest endpoint on loopback: gunzips and msgpack-decodes what the real SDK sends. */
class FakeIngest {
  readonly logs: Record<string, unknown>[] = [];
  readonly requests: { authorization?: string; contentType?: string; contentEncoding?: string }[] = [];
  status = 202;
  #server: Server = createServer((req, res) => this.#handle(req, res));
  async start() {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }
  async stop() {
    this.#server.closeAllConnections();
    await new Promise((resolve) => this.#server.close(resolve));
  }
  #handle(req: IncomingMessage, res: import("node:http").ServerResponse) {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      this.requests.push({
        ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}),
        ...(req.headers["content-type"] ? { contentType: req.headers["content-type"] } : {}),
        ...(req.headers["content-encoding"] ? { contentEncoding: String(req.headers["content-encoding"]) } : {}),
      });
      if (this.status < 300) {
        const body = Buffer.concat(chunks);
        const raw = req.headers["content-encoding"] === "gzip" ? gunzipSync(body) : body;
        this.logs.push(...(decode(raw) as Record<string, unknown>[]));
      }
      res.statusCode = this.status;
      res.end();
    });
  }
}

let ingest: FakeIngest;
let endpoint: string;
beforeEach(async () => {
  ingest = new FakeIngest();
  endpoint = await ingest.start();
  await pg.sql`truncate core.dead_letters cascade`;
});
afterEach(async () => {
  await ingest.stop();
});

const alert = (overrides: Partial<DeadLetterAlert> = {}): DeadLetterAlert => ({
  deadLetterId: "01a20000-0000-7000-8000-000000000001",
  jobId: "01a20000-0000-7000-8000-0000000000aa",
  queue: "loyalty.points",
  consumer: "loyalty.award-points",
  tenantId: "acme",
  kind: "points.award.v1",
  correlationId: "req-1",
  errorClass: "exhausted",
  attempts: 5,
  error: "Error: partner timed out after 3000 ms",
  ...overrides,
});
const sdk = { batchInterval: 20, retryCount: 0 };
/** The adapter pointed at the fake ingest, sending fast and without SDK retries. */
const alertsTo = (url: string, options: Partial<Parameters<typeof createBetterStackAlerts>[0]> = {}) =>
  createBetterStackAlerts({ sourceToken: "t", endpoint: url, sdkOptions: sdk, logger: silentLogger, ...options });

describe("BetterStack alerts through the real @logtail/node client", () => {
  test("a new dead letter sends one alert with its ids, class and error — and nothing of the payload", async () => {
    const secretPayload = createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "jane@example.com", points: 5 },
    });
    const alerts = createBetterStackAlerts({ sourceToken: "tok-123", endpoint, sdkOptions: sdk, logger: silentLogger });
    const consumer = defineConsumer({
      name: "loyalty.award-points",
      queue: "loyalty.points",
      kind: "points.award.v1",
      schema: z.object({ customerId: z.string(), points: z.number() }),
      handle: async () => {
        throw new PermanentError("account closed");
      },
    });
    const result = await bindConsumer(consumer, { db: pg.db, alerts, logger: silentLogger }).deliver({
      body: JSON.stringify(secretPayload),
      deliveryCount: 1,
    });
    await alerts.flush();

    expect(ingest.requests[0]).toEqual({
      authorization: "Bearer tok-123",
      contentType: "application/msgpack",
      contentEncoding: "gzip",
    });
    expect(ingest.logs).toHaveLength(1);
    expect(ingest.logs[0]).toMatchObject({
      level: "error",
      message: "dead letter: permanent in loyalty.award-points (loyalty.points)",
      softcrum_alert: "dead_letter",
      dead_letter_id: (result as { deadLetterId: string }).deadLetterId,
      job_id: secretPayload.job_id,
      queue: "loyalty.points",
      consumer: "loyalty.award-points",
      tenant_id: "acme",
      kind: "points.award.v1",
      correlation_id: secretPayload.correlation_id,
      error_class: "permanent",
      attempts: 1,
      error: "PermanentError: account closed",
    });
    expect(JSON.stringify(ingest.logs)).not.toContain("jane@example.com");
    await alerts.close();
  });

  test("identical failures inside the window make one alert plus one summary with the count", async () => {
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 60_000 });
    for (let i = 0; i < 5; i++) {
      alerts.deadLetterCreated(
        alert({
          deadLetterId: `01a20000-0000-7000-8000-00000000000${i}`,
          error: `Error: partner timed out after ${3000 + i} ms`,
        }),
      );
    }
    alerts.deadLetterCreated(alert({ errorClass: "permanent", error: "PermanentError: closed" })); // another class: its own alert
    alerts.deadLetterCreated(alert({ consumer: "other.consumer" })); // another consumer: its own alert
    await alerts.flush();

    const single = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter");
    const summaries = ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letters_coalesced");
    expect(single).toHaveLength(3);
    expect(summaries).toEqual([
      expect.objectContaining({
        count: 4,
        first_dead_letter_id: "01a20000-0000-7000-8000-000000000000",
        queue: "loyalty.points",
        consumer: "loyalty.award-points",
        error_class: "exhausted",
        error_fingerprint: errorFingerprint("Error: partner timed out after 3000 ms"),
      }),
    ]);
    await alerts.close();
  });

  test("after the window, the same failure alerts again", async () => {
    const alerts = alertsTo(endpoint, { coalesceWindowMs: 50 });
    alerts.deadLetterCreated(alert());
    await new Promise((r) => setTimeout(r, 120));
    alerts.deadLetterCreated(alert());
    await alerts.flush();
    expect(ingest.logs.filter((l) => l["softcrum_alert"] === "dead_letter")).toHaveLength(2);
    await alerts.close();
  });

  test("an ingest answering 500 loses no dead letter and the failure is counted", async () => {
    ingest.status = 500;
    const metrics = recordingMetrics();
    const alerts = alertsTo(endpoint, { metrics: metrics.port });
    const consumer = defineConsumer({
      name: "a.c",
      queue: "a.q",
      kind: "k.v1",
      schema: z.object({}),
      handle: async () => {},
    });
    const result = await bindConsumer(consumer, {
      db: pg.db,
      alerts,
      metrics: metrics.port,
      logger: silentLogger,
    }).deliver({
      body: "not json",
      deliveryCount: 1,
    });
    expect(result).toMatchObject({ outcome: "poison", ack: true });
    await alerts.flush();
    expect(ingest.requests.length).toBeGreaterThan(0);
    expect(alerts.failed).toBe(1);
    expect(metrics.alertFailures).toBe(1);
    const [row] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
    expect(row?.n).toBe(1);
    await alerts.close();
  });

  test("configuration errors are clear", () => {
    expect(() => createBetterStackAlerts({ sourceToken: "" })).toThrow(/sourceToken is required/);
    expect(() => createBetterStackAlerts({ sourceToken: "t", coalesceWindowMs: -1 })).toThrow(/coalesceWindowMs/);
  });

  test("fingerprints ignore ids, numbers and quoted values, not the words", () => {
    expect(errorFingerprint('order 12 "abc" not found')).toBe(errorFingerprint("order 9981 'zz' not found"));
    expect(errorFingerprint("order 12 not found")).not.toBe(errorFingerprint("order 12 was cancelled"));
  });
});
