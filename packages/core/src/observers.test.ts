/**
 * #18 item 4: observers never change an outcome. A metrics port, a logger or
 * an alert sink that throws, rejects or hangs is caught, counted and bounded;
 * the delivery's outcome is what the database says. Real Postgres.
 */
import { describe, expect, test } from "vitest";
import { effects, testConsumers, useEffectsDatabase } from "../test/fixtures.ts";
import { bindConsumer, type HarnessDeps } from "./consumer.ts";
import { createEnvelope } from "./envelope.ts";
import { PermanentError } from "./errors.ts";
import type { AlertPort } from "./ports/alerts.ts";
import type { Logger } from "./ports/logger.ts";
import type { MetricsPort } from "./ports/metrics.ts";

const pg = useEffectsDatabase("observers");
const make = testConsumers("observers");
const consumer = (fail?: "permanent") =>
  make(async (data, { tx, envelope }) => {
    if (fail === "permanent") throw new PermanentError("rejected");
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
  });
const throwingMetrics: MetricsPort = {
  jobProcessed() {
    throw new Error("metrics exporter exploded");
  },
  handlerDuration() {
    throw new Error("metrics exporter exploded");
  },
  alertFailed() {
    throw new Error("metrics exporter exploded");
  },
};
const throwingLogger: Logger = {
  warn() {
    throw new Error("log sink full");
  },
  error() {
    throw new Error("log sink full");
  },
};
const job = (n: number) => JSON.stringify(createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } }));
const stateOf = async (body: string) => {
  const jobId = JSON.parse(body).job_id as string;
  const [row] = await pg.sql<{ effects: number; fences: number; letters: number; occurrences: number }[]>`
    select (select count(*)::int from test_effects where job_id = ${jobId}) as effects,
           (select count(*)::int from core.processed_jobs where job_id = ${jobId}) as fences,
           (select count(*)::int from core.dead_letters where job_id = ${jobId}) as letters,
           (select coalesce(sum(occurrences), 0)::int from core.dead_letters where job_id = ${jobId}) as occurrences`;
  return row;
};
const deps = (extra: Partial<HarnessDeps>): HarnessDeps => ({ db: pg.db, ...extra });

describe("observers never change an outcome (#18 item 4)", () => {
  test("a metrics port that throws: a committed job is a success, and its redelivery a duplicate, not a throw", async () => {
    const bound = bindConsumer(consumer(), deps({ metrics: throwingMetrics, logger: throwingLogger }));
    const body = job(1);
    expect(await bound.deliver({ body, deliveryCount: 1 })).toMatchObject({ outcome: "success", ack: true });
    expect(await bound.deliver({ body, deliveryCount: 2 })).toMatchObject({ outcome: "duplicate", ack: true });
    expect(await stateOf(body)).toEqual({ effects: 1, fences: 1, letters: 0, occurrences: 0 });
    expect(
      (bound as unknown as { observerFailures: { metrics: number } }).observerFailures.metrics,
    ).toBeGreaterThanOrEqual(3);
  });

  test("a metrics port that throws on a dead letter: one letter, acknowledged, never an endless upsert", async () => {
    const bound = bindConsumer(consumer("permanent"), deps({ metrics: throwingMetrics, logger: throwingLogger }));
    const body = job(2);
    expect(await bound.deliver({ body, deliveryCount: 1 })).toMatchObject({
      outcome: "dead_lettered",
      errorClass: "permanent",
      ack: true,
    });
    const poison = JSON.stringify({ ...JSON.parse(job(3)), data: { n: "three" } });
    expect(await bound.deliver({ body: poison, deliveryCount: 1 })).toMatchObject({ outcome: "poison", ack: true });
    expect(await stateOf(body)).toEqual({ effects: 0, fences: 0, letters: 1, occurrences: 1 });
    expect(await stateOf(poison)).toEqual({ effects: 0, fences: 0, letters: 1, occurrences: 1 });
  });

  test("a metrics port that returns a rejected promise is counted, not left unhandled", async () => {
    const rejecting = {
      jobProcessed: () => Promise.reject(new Error("async exporter down")),
      handlerDuration: () => Promise.reject(new Error("async exporter down")),
      alertFailed: () => Promise.reject(new Error("async exporter down")),
    } as unknown as MetricsPort;
    const bound = bindConsumer(consumer(), deps({ metrics: rejecting, logger: throwingLogger }));
    expect(await bound.deliver({ body: job(4), deliveryCount: 1 })).toMatchObject({ outcome: "success" });
    await new Promise((r) => setTimeout(r, 10));
    expect((bound as unknown as { observerFailures: { metrics: number } }).observerFailures.metrics).toBe(2);
  });

  test("an alert sink that hangs does not hold flushAlerts() past its bound; one that throws does not change the letter", async () => {
    const hanging: AlertPort = {
      deadLetterCreated: () => new Promise(() => {}),
      flush: () => new Promise(() => {}),
    };
    const bound = bindConsumer(
      consumer("permanent"),
      deps({ alerts: hanging, alertFlushTimeoutMs: 200, logger: throwingLogger, metrics: throwingMetrics }),
    );
    expect(await bound.deliver({ body: job(5), deliveryCount: 1 })).toMatchObject({ outcome: "dead_lettered" });
    const flushed = await Promise.race([
      bound.flushAlerts?.().then(() => "flushed"),
      new Promise((r) => setTimeout(r, 5_000, "still waiting")),
    ]);
    expect(flushed).toBe("flushed");

    const throwing: AlertPort = {
      deadLetterCreated() {
        throw new Error("alert sink exploded");
      },
    };
    const other = bindConsumer(consumer("permanent"), deps({ alerts: throwing, logger: throwingLogger }));
    const body = job(6);
    expect(await other.deliver({ body, deliveryCount: 1 })).toMatchObject({ outcome: "dead_lettered", ack: true });
    expect(await stateOf(body)).toEqual({ effects: 0, fences: 0, letters: 1, occurrences: 1 });
  });

  test("bindConsumer refuses an alertFlushTimeoutMs that is not a positive number", () => {
    expect(() => bindConsumer(consumer(), deps({ alertFlushTimeoutMs: 0 }))).toThrow(/alertFlushTimeoutMs/);
  });
});
