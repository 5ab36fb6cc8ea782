import { describe, expect, test } from "vitest";
import { chaosFaults, TEST_QUEUE_SECRET } from "../../../test/fake-vercel-queues.ts";
import { silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture, random } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { InvalidConfigError, InvalidEnvelopeError, RateLimitedError } from "../../errors.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { DEFAULT_RETRY_POLICY, retryDelayMs } from "../../retry.ts";
import { createVercelQueue, toVercelTopic, type VercelIncident, vercelTrigger } from "./index.ts";

const pg = useEffectsDatabase("vercel-limits");

const { pointsConsumer, rateLimitedConsumer, bind, effectRows, letters } = pointsFixture(pg, "limits");
const backoff = (attempt: number) => Math.ceil(retryDelayMs(DEFAULT_RETRY_POLICY, attempt, random) / 1000);

const open = useVercelHarnesses();
const incidents = () => {
  const seen: VercelIncident[] = [];
  return { seen, onIncident: (incident: VercelIncident) => void seen.push(incident) };
};

/** Dead-letter writes fail (a database that refuses them) until `allow()`. */
async function refuseDeadLetters() {
  await pg.sql.unsafe(`
    create or replace function test_refuse_letters() returns trigger language plpgsql as
      $$ begin raise exception 'disk full (simulated)'; end $$;
    create trigger refuse_letters before insert on core.dead_letters
      for each row execute function test_refuse_letters();`);
  return { allow: () => pg.sql`drop trigger if exists refuse_letters on core.dead_letters` };
}

describe("the harness dead-letters before the transport drops (#11 item 1)", () => {
  test("a route or trigger whose maxDeliveries is below maxAttempts + 2 is refused where it is bound", async () => {
    const h = await open("push");
    const consumer = pointsConsumer();
    const bound = bind(consumer);
    expect(() => h.queue.pushHandler(bound, { maxDeliveries: 6 })).toThrow(
      /maxDeliveries 6 is below its maxAttempts \+ 2 \(7\)/,
    );
    expect(() => h.queue.pushHandler(bound, { maxDeliveries: 7 })).not.toThrow();
    await expect(h.queue.receiveAvailable(bound, { maxDeliveries: 3 })).rejects.toThrow(InvalidConfigError);
    expect(() =>
      vercelTrigger(consumer, { route: "app/api/q/route.ts", maxDeliveries: 3, databaseConnections: 4 }),
    ).toThrow(/below maxAttempts \+ 2/);
  });

  test("a job whose dead letter cannot be written survives its last permitted delivery: a fresh copy carries its attempts, and the letter is written once the database takes it", async () => {
    const refused = await refuseDeadLetters();
    try {
      const { seen, onIncident } = incidents();
      const h = await open("push", { maxDeliveries: 7, retryAfterSeconds: 60, onIncident });
      const attempts: number[] = [];
      const consumer = pointsConsumer((ctx) => {
        attempts.push(ctx.attempt);
        throw new Error("partner down");
      });
      h.subscribe(bind(consumer));
      await h.queue.publish(consumer.queue, award());
      // 5 attempts, then deliveries 6 and 7 fail to write the letter; the 7th is the last the trigger allows.
      for (let round = 0; round < 50 && !seen.some((i) => i.kind === "rescued_before_drop"); round++) {
        await h.fake.dispatch();
        const next = h.fake.nextVisibleAt();
        if (next !== undefined) h.fake.clock.advanceTo(next);
      }
      expect(seen.map((i) => i.kind)).toContain("rescued_before_drop");
      await refused.allow();
      await h.settle();
      expect(h.fake.drops).toEqual([]);
      expect(attempts).toEqual([1, 2, 3, 4, 5]);
      const [letter, ...more] = await letters(consumer.name);
      expect(more).toEqual([]);
      expect(letter).toMatchObject({ errorClass: "exhausted", status: "pending_review" });
      expect(letter?.lastError).toMatch(/partner down/);
    } finally {
      await refused.allow();
    }
  });

  test("a retry that would come back after the message expires is carried by a fresh copy, not a lease change the service refuses (#11 items 1, 2)", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (ctx.attempt === 1) throw new Error("partner timeout");
    });
    h.subscribe(bind(consumer));
    // Another producer's message with a short retention, delivered 10 s before it expires.
    h.fake.inject(toVercelTopic(consumer.queue), JSON.stringify(award()), { retentionSeconds: 600, delaySeconds: 590 });
    await h.settle();
    expect(attempts).toEqual([1, 2]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.drops).toEqual([]);
    const copy = h.fake.sends.at(-1);
    expect(copy).toMatchObject({ delaySeconds: backoff(1), retentionSeconds: 604_800 });
  });

  test("when neither a fresh copy nor the lease can bring it back before it expires, the dead letter is written now (expired)", async () => {
    const { seen, onIncident } = incidents();
    const h = await open("push", { onIncident });
    const consumer = pointsConsumer(() => {
      throw new Error("partner timeout");
    });
    h.subscribe(bind(consumer));
    h.fake.inject(toVercelTopic(consumer.queue), JSON.stringify(award()), { retentionSeconds: 600, delaySeconds: 590 });
    h.fake.failSends(1);
    await h.settle();
    expect(h.fake.drops).toEqual([]);
    const rows = await letters(consumer.name);
    expect(rows.map((r) => [r.errorClass, r.attempts])).toEqual([["expired", 1]]);
    expect(rows[0]?.lastError).toMatch(/after the message expires/);
    expect(seen.map((i) => i.kind)).toContain("dead_lettered_before_drop");
  });
});

describe("regions and deployments (#11 item 3)", () => {
  test("a poll worker needs a fixed region and unpinned consumption; anything else is refused where it is bound", async () => {
    const consumer = bind(pointsConsumer());
    const fromEnv = createVercelQueue({
      env: { VERCEL_REGION: "iad1" },
      token: "t",
      deploymentId: null,
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    expect(() => fromEnv.startWorker(consumer)).toThrow(/fixed region \(options.region\), not VERCEL_REGION/);
    await expect(fromEnv.receiveAvailable(consumer)).rejects.toThrow(InvalidConfigError);
    const pinned = createVercelQueue({
      env: {},
      region: "iad1",
      token: "t",
      deploymentId: "dpl_A",
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    expect(() => pinned.startWorker(consumer)).toThrow(/must consume unpinned \(deploymentId: null\)/);
    // A push route is pinned by nature: the deployment that sent the message serves it.
    expect(() => pinned.pushHandler(consumer)).not.toThrow();
    await Promise.all([fromEnv.close(), pinned.close()]);
  });

  test("a job pinned to deployment A is served by A's route, deferral included, while deployment B's route runs beside it", async () => {
    const h = await open("push", { fake: { deployments: "strict" } });
    const seenBy: string[] = [];
    let limited = 1;
    const consumer = pointsConsumer(() => {
      if (limited-- > 0) throw new RateLimitedError("429", { retryAfterMs: 5_000 });
    });
    const topic = toVercelTopic(consumer.queue);
    const route = (deploymentId: string) => {
      const queue = createVercelQueue({
        ...h.fake.clientOptions(),
        deploymentId,
        clock: h.fake.clock,
        env: {},
        logger: silentLogger,
      });
      const handler = queue.pushHandler(bind(consumer));
      return async (request: Request) => {
        seenBy.push(deploymentId);
        return handler(request);
      };
    };
    for (const deploymentId of ["dpl_A", "dpl_B"]) {
      h.fake.subscribePush(topic, route(deploymentId), { group: "route_award", deploymentId });
    }
    const producer = createVercelQueue({
      ...h.fake.clientOptions(),
      deploymentId: "dpl_A",
      env: {},
      logger: silentLogger,
    });
    await producer.publish(consumer.queue, award());
    await h.settle();
    expect(seenBy).toEqual(["dpl_A", "dpl_A"]);
    expect(h.fake.sends.map((s) => s.deploymentId)).toEqual(["dpl_A", "dpl_A"]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("an unpinned producer and an unpinned poll worker in a fixed region meet even when pinned and unpinned never do", async () => {
    const h = await open("poll", { region: "fra1", fake: { deployments: "strict" } });
    const consumer = pointsConsumer();
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    expect(h.fake.sends[0]?.region).toBe("fra1");
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });
});

describe("republish keys that cannot collide (#11 item 4)", () => {
  test("two deployments' messages with the same id, both rate-limited, each keep their deferral", async () => {
    const h = await open("push", { fake: { messageIds: "sequence" } });
    let limited = 2;
    const consumer = pointsConsumer(() => {
      if (limited-- > 0) throw new RateLimitedError("429", { retryAfterMs: 5_000 });
    });
    const topic = toVercelTopic(consumer.queue);
    for (const deploymentId of ["dpl_A", "dpl_B"]) {
      const queue = createVercelQueue({
        ...h.fake.clientOptions(),
        deploymentId,
        clock: h.fake.clock,
        env: {},
        logger: silentLogger,
      });
      h.fake.subscribePush(topic, queue.pushHandler(bind(consumer)), { group: "route_award", deploymentId });
      await queue.publish(consumer.queue, award(1, deploymentId));
    }
    expect(h.fake.sends.map((s) => s.messageId)).toEqual(["0-1", "0-1"]);
    await h.settle();
    expect(h.fake.sends.filter((s) => s.deduplicated)).toEqual([]);
    expect(await effectRows(consumer.name)).toHaveLength(2);
  });
});

describe("lease races and failed directives (#11 item 5)", () => {
  test("a failed acknowledgement is an incident, a metric and a 500, and the early redelivery is a duplicate the fence absorbs", async () => {
    const { seen, onIncident } = incidents();
    const counted: string[] = [];
    const metrics = { transportIncident: (a: { kind: string }) => void counted.push(a.kind) };
    const h = await open("push", { onIncident, metrics });
    const consumer = pointsConsumer();
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    h.fake.failLeaseCalls(1, { method: "DELETE", status: 503 });
    await h.fake.dispatch();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([500]);
    expect(seen.map((i) => i.kind)).toEqual(["ack_failed"]);
    await h.settle();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([500, 200]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.queue.incidentCounts()).toEqual({ ack_failed: 1 });
    expect(counted).toEqual(["ack_failed"]);
  });

  test("acks dropped silently and leases ending early: every job has exactly one effect, and none is dropped", async () => {
    const h = await open("push", { fake: { faults: chaosFaults({ seed: 11, lostAcks: 0.1, earlyRedelivery: 0.1 }) } });
    const failedOnce = new Set<string>();
    const consumer = pointsConsumer((ctx) => {
      if (!failedOnce.has(ctx.envelope.job_id) && (ctx.envelope.data as { points: number }).points % 3 === 0) {
        failedOnce.add(ctx.envelope.job_id);
        throw new Error("flaky partner");
      }
    });
    h.subscribe(bind(consumer));
    for (let i = 1; i <= 30; i++) await h.queue.publish(consumer.queue, award(i));
    await h.settle();
    const rows = await effectRows(consumer.name);
    expect(rows).toHaveLength(30);
    expect(new Set(rows.map((r) => r.jobId)).size).toBe(30);
    expect(h.fake.drops).toEqual([]);
    // The faults did happen: some acks were dropped, so some deliveries were duplicates.
    expect(h.fake.leaseCalls.some((c) => c.method === "DELETE" && !c.applied)).toBe(true);
    expect(h.fake.callbacks.length).toBeGreaterThan(30 + failedOnce.size);
  });

  test("a failed retry directive is an incident, and the job comes back when its lease ends", async () => {
    const { seen, onIncident } = incidents();
    const h = await open("poll", { onIncident });
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (ctx.attempt === 1) throw new Error("flaky");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    h.fake.failLeaseCalls(1, { method: "PATCH", status: 500 });
    await h.settle();
    expect(seen.map((i) => i.kind)).toEqual(["visibility_failed"]);
    expect(attempts).toEqual([1, 2]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("a lease renewal in flight when the handler fails lands before the retry directive, never after it", async () => {
    const h = await open("poll", { leaseRenewalMs: 20 });
    let renewing: (() => void) | undefined;
    let renewalStarted: () => void = () => {};
    const started = new Promise<void>((resolve) => {
      renewalStarted = resolve;
    });
    h.fake.faults = {
      async leaseCall(call) {
        if (call.method === "PATCH" && call.visibilityTimeoutSeconds === 300 && !renewing) {
          // The first renewal: held until the handler has failed.
          await new Promise<void>((resolve) => {
            renewing = resolve;
            renewalStarted();
          });
        }
        return undefined;
      },
    };
    const consumer = pointsConsumer(async (ctx) => {
      if (ctx.attempt > 1) return;
      await Promise.race([started, new Promise((r) => setTimeout(r, 10_000))]);
      setTimeout(() => renewing?.(), 50); // the renewal answers after the handler failed
      throw new Error("flaky");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.queue.receiveAvailable(bind(consumer)).catch(() => {});
    const patches = h.fake.leaseCalls.map((c) => [c.method, c.visibilityTimeoutSeconds]);
    expect(patches).toEqual([
      ["PATCH", 300],
      ["PATCH", backoff(1)],
    ]);
    // The message is due after the backoff, not after a full lease.
    expect(h.fake.nextVisibleAt()).toBe(h.fake.clock.now() + backoff(1) * 1000);
  });
});

describe("a poll worker never stalls silently (#11 item 6)", () => {
  test("repeated auth failures raise an alert, mark the worker degraded, and fail it after the limit", async () => {
    const { seen, onIncident } = incidents();
    const h = await open("poll");
    const stale = createVercelQueue({
      ...h.fake.clientOptions(),
      token: "expired",
      env: {},
      logger: silentLogger,
      onIncident,
    });
    const worker = stale.startWorker(bind(pointsConsumer()), {
      concurrency: 1,
      replayConcurrency: 0, // one loop, so the incidents can be counted exactly
      errorDelayMs: 1,
      authAlertAfter: 2,
      maxAuthFailures: 4,
    });
    const failure = await worker.failed;
    expect(failure.message).toMatch(/4 consecutive auth failures/);
    expect(worker.health()).toMatchObject({ state: "failed", consecutiveAuthFailures: 4 });
    expect(seen.map((i) => [i.kind, i.alert])).toEqual([
      ["auth_failed", false],
      ["auth_failed", true],
      ["auth_failed", false],
      ["worker_failed", true],
    ]);
    await worker.stop();
    await stale.close();
  });

  test("a new consumer group starts at the oldest retained message, whatever the server's default cursor", async () => {
    const h = await open("poll", { fake: { cursorDefault: "latest" } });
    const consumer = pointsConsumer();
    await h.queue.publish(consumer.queue, award());
    expect(await h.queue.receiveAvailable(bind(consumer))).toBe(1);
    expect(h.fake.receives[0]?.cursorFallback).toBe("earliest");
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });
});

describe("size (#11 item 8)", () => {
  const limit = 64 * 1024;
  /** An award whose JSON is about `bytes` long, made of quotes (each escaped: the worst case for a JSON wrapper). */
  const quoted = (bytes: number) => award(1, '"'.repeat(Math.floor((bytes - 300) / 2)));

  test("a rate-limited job near the size limit is deferred without spending an attempt", async () => {
    const h = await open("push", { maxMessageBytes: limit, fake: { maxMessageBytes: limit } });
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (attempts.length === 1) throw new RateLimitedError("429", { retryAfterMs: 5_000 });
    });
    h.subscribe(bind(consumer));
    const envelope = quoted(limit - 1_100);
    expect(Buffer.byteLength(JSON.stringify(envelope))).toBeGreaterThan(limit - 1_500);
    await h.queue.publish(consumer.queue, envelope);
    await h.settle();
    expect(h.fake.sends.map((s) => s.status)).toEqual([201, 201]);
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("an envelope that could not be wrapped is refused at publish, and nothing is sent", async () => {
    const h = await open("push", { maxMessageBytes: limit, fake: { maxMessageBytes: limit } });
    await expect(h.queue.publish("limits.big", quoted(limit - 200))).rejects.toThrow(InvalidEnvelopeError);
    expect(h.fake.sends).toEqual([]);
  });

  test("another producer's message too large to defer or replay is a poison letter, its payload kept", async () => {
    const h = await open("push", { maxMessageBytes: limit, fake: { maxMessageBytes: limit } });
    const consumer = pointsConsumer();
    h.subscribe(bind(consumer));
    const body = JSON.stringify(quoted(limit - 200));
    h.fake.inject(toVercelTopic(consumer.queue), body);
    await h.settle();
    const rows = await letters(consumer.name);
    expect(rows.map((r) => r.errorClass)).toEqual(["poison"]);
    expect(rows[0]?.payload).toBe(body);
    expect(await effectRows(consumer.name)).toHaveLength(0);
  });
});

describe("the service's answers to a republish (#11 item 7)", () => {
  /** A push route whose job is rate-limited on its first run (so the adapter republishes a copy), published. */
  async function rateLimitedOnce() {
    const h = await open("push");
    const { consumer, attempts } = rateLimitedConsumer(1);
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    return { h, consumer, attempts };
  }

  test("202 (accepted, no id): the copy runs, and the original kept as insurance comes back as a duplicate", async () => {
    const { h, consumer, attempts } = await rateLimitedOnce();
    h.fake.failNextSends({ status: 202 });
    await h.settle();
    expect(h.fake.sends.map((x) => x.status)).toEqual([201, 202]);
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.drops).toEqual([]);
    // The original waited past the copy's delay, then was a duplicate (acknowledged, nothing ran).
    expect(h.fake.leaseCalls.filter((c) => c.method === "PATCH").map((c) => c.visibilityTimeoutSeconds)).toContain(80);
  });

  test("202 whose deferred processing never stores the copy: the original kept as insurance runs the job, still as attempt 1 (#19)", async () => {
    const { h, consumer, attempts } = await rateLimitedOnce();
    h.fake.failNextSends({ status: 202, store: false });
    await h.settle();
    // The kept delivery spent no attempt (a recorded hold), so neither does its comeback.
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  for (const fault of [
    { status: 429, retryAfter: 30 },
    { status: 502, errorCode: "consumer_discovery_failed" },
    { status: 503 },
  ]) {
    test(`${fault.status}: a deferral that cannot be sent waits on its lease instead, the job is not lost, and the wait spends no attempt (#19)`, async () => {
      const { seen, onIncident } = incidents();
      const h = await open("poll", { onIncident });
      const attempts: number[] = [];
      const consumer = pointsConsumer((ctx) => {
        attempts.push(ctx.attempt);
        if (attempts.length === 1) throw new RateLimitedError("429", { retryAfterMs: 20_000 });
      });
      h.subscribe(bind(consumer));
      await h.queue.publish(consumer.queue, award());
      h.fake.failNextSends(fault);
      await h.settle();
      expect(attempts).toEqual([1, 1]);
      expect(await effectRows(consumer.name)).toHaveLength(1);
      expect(seen.map((i) => i.kind)).toEqual(["republish_failed"]);
    });
  }
});

describe("push route trust (#10 item 16)", () => {
  const forged = (topic: string, group: string, body: string, handle = "rh_invented") =>
    new Request("http://route.invalid/", {
      method: "POST",
      headers: {
        "ce-type": "com.vercel.queue.v2beta",
        "ce-vqsqueuename": topic,
        "ce-vqsconsumergroup": group,
        "ce-vqsmessageid": "msg_forged",
        "ce-vqsreceipthandle": handle,
        "ce-vqsdeliverycount": "99",
        "ce-vqscreatedat": new Date().toISOString(),
        "content-type": "application/json",
      },
      body,
    });

  test("a forged callback never runs the handler: the lease it names is not confirmed by the service", async () => {
    const { seen, onIncident } = incidents();
    const h = await open("push", { onIncident });
    let ran = 0;
    const consumer = pointsConsumer(() => {
      ran += 1;
    });
    const route = h.queue.pushHandler(bind(consumer));
    const topic = toVercelTopic(consumer.queue);
    const response = await route(forged(topic, "route_x", JSON.stringify(award())));
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ status: "skipped" });
    expect(ran).toBe(0);
    expect(await effectRows(consumer.name)).toHaveLength(0);
    expect(await letters(consumer.name)).toHaveLength(0);
    expect(seen.map((i) => i.kind)).toEqual(["unconfirmed_callback"]);
  });

  test("a genuine callback replayed after its message was acknowledged does not run the handler again", async () => {
    const h = await open("push");
    let ran = 0;
    const consumer = pointsConsumer(() => {
      ran += 1;
    });
    const bound = bind(consumer);
    const captured: Request[] = [];
    const route = h.queue.pushHandler(bound);
    h.fake.subscribePush(
      toVercelTopic(consumer.queue),
      async (request) => {
        captured.push(request.clone());
        return route(request);
      },
      { group: "route_x" },
    );
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    expect(ran).toBe(1);
    const replayed = await route(captured[0] as Request);
    expect(await replayed.json()).toEqual({ status: "skipped" });
    expect(ran).toBe(1);
  });

  test("a hand-made consumer sees nothing of a forged callback either", async () => {
    const h = await open("push");
    const deliveries: unknown[] = [];
    const consumer: BoundConsumer = {
      name: "limits.raw",
      queue: "limits.raw",
      deliver: async (d) => {
        deliveries.push(d);
        return { outcome: "success", ack: true };
      },
    };
    const route = h.queue.pushHandler(consumer);
    await route(forged("limits_Draw", "g", "{}"));
    expect(deliveries).toEqual([]);
  });
});
