import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from "@opentelemetry/sdk-metrics";
import { useTestDatabase } from "@softcrum/testing";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { createEffectsTable, effects, silentLogger } from "../../../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "../../consumer.ts";
import { createEnvelope } from "../../envelope.ts";
import { PermanentError, RateLimitedError } from "../../errors.ts";
import { createOps } from "../../ops/index.ts";
import { createOtelMetrics } from "./index.ts";

const pg = useTestDatabase("otel");
let exporter: InMemoryMetricExporter;
let reader: PeriodicExportingMetricReader;
let provider: MeterProvider;

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters cascade`;
  exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  provider = new MeterProvider({ readers: [reader] });
});
afterEach(async () => {
  await provider.shutdown();
});

/** Every data point of an instrument after a collection, as [attributes, value]. */
async function points(name: string) {
  await reader.forceFlush();
  const all = exporter.getMetrics().flatMap((rm) => rm.scopeMetrics.flatMap((sm) => sm.metrics));
  const latest = all.filter((m) => m.descriptor.name === name).at(-1);
  return (latest?.dataPoints ?? []).map((p) => [p.attributes, p.value] as const);
}

const consumer = defineConsumer({
  name: "otel.award",
  queue: "otel.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    if (data.customerId === "closed") throw new PermanentError("closed");
    if (data.customerId === "busy") throw new RateLimitedError("slow down", { retryAfterMs: 1000 });
    if (data.customerId === "flaky") throw new Error("timeout");
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "otel.award", amount: data.points });
  },
});
const body = (customerId: string) =>
  JSON.stringify(createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId, points: 1 } }));

describe("OpenTelemetry metrics", () => {
  test("each outcome increments softcrum.job.processed with the messaging attributes", async () => {
    const metrics = createOtelMetrics({ meter: provider.getMeter("test") });
    const bound = bindConsumer(consumer, { db: pg.db, metrics, logger: silentLogger });
    const ok = body("c1");
    await bound.deliver({ body: ok, deliveryCount: 1 }); // success
    await bound.deliver({ body: ok, deliveryCount: 2 }); // duplicate
    await bound.deliver({ body: body("flaky"), deliveryCount: 1 }); // retry
    await bound.deliver({ body: body("closed"), deliveryCount: 1 }); // dead_lettered
    await bound.deliver({ body: "not json", deliveryCount: 1 }); // poison
    await bound.deliver({ body: body("busy"), deliveryCount: 1 }); // rate_limited

    const byOutcome = Object.fromEntries(
      (await points("softcrum.job.processed")).map(([attributes, value]) => [
        attributes["softcrum.job.outcome"],
        value,
      ]),
    );
    expect(byOutcome).toEqual({ success: 1, duplicate: 1, retry: 1, dead_lettered: 1, poison: 1, rate_limited: 1 });
    const [first] = await points("softcrum.job.processed");
    expect(first?.[0]).toMatchObject({
      "messaging.system": "softcrum",
      "messaging.destination.name": "otel.points",
      "messaging.consumer.group.name": "otel.award",
    });

    const durations = await points("messaging.process.duration");
    const success = durations.find(([a]) => a["softcrum.job.outcome"] === "success");
    expect(success?.[0]).toMatchObject({ "messaging.operation.name": "process" });
    const histogram = success?.[1] as { count: number; sum: number } | undefined;
    expect(histogram?.count).toBe(1);
    expect(histogram?.sum).toBeGreaterThan(0);
  });

  test("dead-letter depth and oldest pending age are observable gauges per queue and consumer", async () => {
    const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });
    await bound.deliver({ body: body("closed"), deliveryCount: 1 });
    await bound.deliver({ body: "garbage", deliveryCount: 1 });
    const ops = createOps({
      db: pg.db,
      queue: {
        publish: async () => ({ messageId: null, stored: true }),
        schedule: async () => ({ messageId: null, stored: true }),
      },
    });
    const metrics = createOtelMetrics({
      meter: provider.getMeter("test"),
      deadLetterDepth: () => ops.deadLetters.depth(),
    });

    const depth = await points("softcrum.dead_letter.depth");
    expect(depth).toEqual([
      [
        {
          "messaging.system": "softcrum",
          "messaging.destination.name": "otel.points",
          "messaging.consumer.group.name": "otel.award",
        },
        2,
      ],
    ]);
    const [age] = await points("softcrum.dead_letter.oldest_age");
    expect(age?.[1]).toBeGreaterThanOrEqual(0);
    expect(age?.[1]).toBeLessThan(60);

    // Once the letters are resolved, the gauges go back to zero instead of keeping their last value.
    await pg.sql`update core.dead_letters set status = 'discarded', status_changed_at = now(), status_changed_by = 'ops', status_reason = 'test'`;
    expect((await points("softcrum.dead_letter.depth")).map(([, v]) => v)).toEqual([0]);
    expect((await points("softcrum.dead_letter.oldest_age")).map(([, v]) => v)).toEqual([0]);
    metrics.close();
  });

  test("replays, failed-again jobs and failed alerts are counted", async () => {
    const metrics = createOtelMetrics({ meter: provider.getMeter("test") });
    metrics.replayed({ queue: "q", consumer: "c" });
    metrics.replayed({ queue: "q", consumer: "c" });
    metrics.failedAgain(3);
    metrics.alertFailed({ queue: "q", consumer: "c" });
    expect((await points("softcrum.dead_letter.replayed")).map(([, v]) => v)).toEqual([2]);
    expect((await points("softcrum.dead_letter.failed_again")).map(([, v]) => v)).toEqual([3]);
    expect((await points("softcrum.alert.failed")).map(([, v]) => v)).toEqual([1]);
  });

  test("a replay batch's recovery report: its jobs by state and its time to recovery (#21 item 7)", async () => {
    const metrics = createOtelMetrics({ meter: provider.getMeter("test") });
    metrics.batchRecovery({
      batchId: "b-1",
      status: "completed",
      replayed: 5,
      succeeded: 3,
      failedAgain: 1,
      inFlight: 0,
      duplicates: 1,
      timeToRecoveryMs: 90_000,
    });
    const jobs = await points("softcrum.replay_batch.jobs");
    expect(Object.fromEntries(jobs.map(([a, v]) => [a["softcrum.replay_batch.state"], v]))).toEqual({
      replayed: 5,
      succeeded: 3,
      failed_again: 1,
      in_flight: 0,
      duplicates: 1,
    });
    expect(jobs.every(([a]) => a["softcrum.replay_batch.id"] === "b-1")).toBe(true);
    expect((await points("softcrum.replay_batch.time_to_recovery")).map(([, v]) => v)).toEqual([90]);
  });

  test("transport incidents are counted by kind (#11 item 5)", async () => {
    const metrics = createOtelMetrics({ meter: provider.getMeter("test") });
    metrics.transportIncident({ queue: "q", consumer: "c", kind: "ack_failed" });
    metrics.transportIncident({ queue: "q", consumer: "c", kind: "ack_failed" });
    const [point] = await points("softcrum.transport.incident");
    expect(point?.[0]).toMatchObject({ "softcrum.transport.incident": "ack_failed" });
    expect(point?.[1]).toBe(2);
  });
});
