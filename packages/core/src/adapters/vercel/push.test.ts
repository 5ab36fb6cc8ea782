import { eq } from "drizzle-orm";
import { describe, expect, test } from "vitest";
import { silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { latch } from "../../../test/latch.ts";
import { award, pointsFixture, random } from "../../../test/points-fixture.ts";
import { useVercelHarnesses, type VercelHarness } from "../../../test/vercel-transport.ts";
import { processedJobs } from "../../db/schema.ts";
import { PermanentError } from "../../errors.ts";
import { createOps } from "../../ops/index.ts";
import { DEFAULT_RETRY_POLICY, retryDelayMs } from "../../retry.ts";
import { createVercelQueue, type VercelIncident } from "./index.ts";
import { toVercelTopic } from "./topics.ts";

const pg = useEffectsDatabase("vercel-push");

const { pointsConsumer, bind, effectRows, letters } = pointsFixture(pg, "vercel");

/** Acknowledgements and visibility changes, without the push route's lease confirmation (a PATCH to the full 300 s lease). */
const directives = (h: VercelHarness) =>
  h.fake.leaseCalls.filter((c) => !(c.method === "PATCH" && c.visibilityTimeoutSeconds === 300));

const open = useVercelHarnesses();

describe("a callback that does not say which delivery it is", () => {
  // The SDK reads ce-vqsdeliverycount with parseInt and leaves it out when
  // the header is missing: the adapter cannot tell a first delivery from the
  // service's last one before its cap drops the message.
  test.each([
    ["missing", undefined],
    ["not a number", "many"],
    ["zero", "0"],
  ])(
    "ce-vqsdeliverycount %s: a failing job is retried in copies that carry its attempts, and dead-lettered after the last one, never left to the service's cap",
    async (_, header) => {
      const h = await open("push", { maxDeliveries: 7 });
      const attempts: number[] = [];
      const consumer = pointsConsumer((ctx) => {
        attempts.push(ctx.attempt);
        throw new Error("partner down");
      });
      const route = h.queue.pushHandler(bind(consumer), { maxDeliveries: 7 });
      const withHeader = async (request: Request) => {
        const headers = new Headers(request.headers);
        if (header === undefined) headers.delete("ce-vqsdeliverycount");
        else headers.set("ce-vqsdeliverycount", header);
        return route(new Request(request.url, { method: "POST", headers, body: await request.arrayBuffer() }));
      };
      h.fake.subscribePush(toVercelTopic(consumer.queue), withHeader, { group: "route_count", maxDeliveries: 7 });
      await h.queue.publish(consumer.queue, award());
      await h.settle(24 * 3_600_000);
      expect(attempts).toEqual([1, 2, 3, 4, 5]);
      const [letter] = await letters(consumer.name);
      expect(letter).toMatchObject({ errorClass: "exhausted", attempts: 5, status: "pending_review" });
      expect(await effectRows(consumer.name)).toHaveLength(0);
    },
  );
});

test("a lease renewal the service never answers does not hold the delivery: its directive (the acknowledgement) goes once the renewal's bound is out", async () => {
  const hung = latch();
  let patches = 0;
  const h = await open("push", {
    leaseRenewalMs: 50,
    republishTimeoutMs: 1_000,
    fake: {
      faults: {
        // The route's confirmation is the first PATCH; the renewal, the second, never answers.
        leaseCall: (call) =>
          call.method === "PATCH" && ++patches === 2 ? hung.opened.then(() => undefined) : undefined,
      },
    },
  });
  const consumer = pointsConsumer(() => new Promise((resolve) => setTimeout(resolve, 300)));
  h.subscribe(bind(consumer));
  await h.queue.publish(consumer.queue, award());
  try {
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      h.fake.dispatch().then(() => "dispatched"),
      new Promise((resolve) => {
        timer = setTimeout(resolve, 8_000, "still waiting on the renewal");
      }),
    ]);
    clearTimeout(timer);
    expect(outcome).toBe("dispatched");
    expect(patches).toBeGreaterThanOrEqual(2);
    expect(h.fake.leaseCalls.filter((c) => c.method === "DELETE").map((c) => c.status)).toEqual([204]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  } finally {
    hung.open();
  }
});

describe("push mode (route handler)", () => {
  test("a transient failure answers with a visibility change of the harness's backoff, and the retry then succeeds", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (ctx.attempt === 1) throw new Error("partner timeout");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.fake.dispatch();
    const backoff = Math.ceil(retryDelayMs(DEFAULT_RETRY_POLICY, 1, random) / 1000);
    expect(h.fake.leaseCalls.map((c) => [c.method, c.visibilityTimeoutSeconds, c.status])).toEqual([
      ["PATCH", 300, 200], // the route confirms its lease before running anything
      ["PATCH", backoff, 200],
    ]);
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([200]);
    await h.settle();
    expect(attempts).toEqual([1, 2]);
    expect(h.fake.leaseCalls.at(-1)).toMatchObject({ method: "DELETE", status: 204 });
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(h.fake.pending(toVercelTopic(consumer.queue), h.fake.callbacks[0]?.group ?? "")).toBe(0);
  });

  test("poison and dead-lettered deliveries are acknowledged and leave a dead-letter row", async () => {
    const h = await open("push");
    const consumer = pointsConsumer((ctx) => {
      if (ctx.envelope.data && (ctx.envelope.data as { points: number }).points === 13) {
        throw new PermanentError("account closed");
      }
    });
    h.subscribe(bind(consumer));
    const topic = toVercelTopic(consumer.queue);
    h.fake.inject(topic, "not json at all");
    await h.queue.publish(consumer.queue, award(13));
    await h.fake.dispatch();
    expect(directives(h).map((c) => c.method)).toEqual(["DELETE", "DELETE"]);
    const rows = await letters(consumer.name);
    expect(rows.map((r) => r.errorClass).sort()).toEqual(["permanent", "poison"]);
    expect(rows.find((r) => r.errorClass === "poison")?.payload).toBe("not json at all");
    expect(h.fake.pending(topic, h.fake.callbacks[0]?.group ?? "")).toBe(0);
  });

  test("a dead-letter write failure is not acknowledged and comes back after the trigger's retry delay", async () => {
    await pg.sql.unsafe(`
      create or replace function test_refuse_dead_letters() returns trigger language plpgsql as
        $$ begin raise exception 'disk full (simulated)'; end $$;
      create trigger refuse_dead_letters before insert on core.dead_letters
        for each row execute function test_refuse_dead_letters();`);
    try {
      const h = await open("push", { retryAfterSeconds: 45 });
      const consumer = pointsConsumer();
      h.subscribe(bind(consumer));
      const topic = toVercelTopic(consumer.queue);
      const id = h.fake.inject(topic, "{broken");
      await h.fake.dispatch();
      const group = h.fake.callbacks[0]?.group ?? "";
      expect(h.fake.callbacks.map((c) => c.status)).toEqual([500]);
      // Not acknowledged: the lease is only set to end with the trigger's retry delay.
      expect(directives(h).map((c) => [c.method, c.visibilityTimeoutSeconds])).toEqual([["PATCH", 45]]);
      expect(h.fake.pending(topic, group)).toBe(1);
      expect(await letters(consumer.name)).toHaveLength(0);

      await pg.sql`drop trigger refuse_dead_letters on core.dead_letters`;
      h.fake.clock.advance(44_000);
      expect(await h.fake.dispatch()).toBe(0);
      h.fake.clock.advance(1_000);
      await h.fake.dispatch();
      expect(h.fake.callbacks.map((c) => [c.deliveryCount, c.status])).toEqual([
        [1, 500],
        [2, 200],
      ]);
      expect(h.fake.deliveryCount(topic, group, id)).toBe(2);
      expect((await letters(consumer.name)).map((r) => r.errorClass)).toEqual(["poison"]);
      expect(h.fake.pending(topic, group)).toBe(0);
    } finally {
      await pg.sql`drop trigger if exists refuse_dead_letters on core.dead_letters`;
    }
  });

  test("a callback for another topic answers 500 and leaves the message unacknowledged", async () => {
    const h = await open("push");
    const consumer = pointsConsumer();
    h.fake.subscribePush("someone_Delse", h.queue.pushHandler(bind(consumer)), { group: "g" });
    h.fake.inject("someone_Delse", JSON.stringify(award()));
    await h.fake.dispatch();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([500]);
    expect(h.fake.leaseCalls).toEqual([]);
    expect(h.fake.pending("someone_Delse", "g")).toBe(1);
    expect(await effectRows(consumer.name)).toHaveLength(0);
  });

  test("a routing-only callback (large message) is received by id, processed and acknowledged", async () => {
    const h = await open("push");
    const consumer = pointsConsumer();
    const topic = toVercelTopic(consumer.queue);
    h.fake.subscribePush(topic, h.queue.pushHandler(bind(consumer)), { group: "big", mode: "by-id" });
    await h.queue.publish(consumer.queue, award());
    await h.fake.dispatch();
    expect(h.fake.callbacks.map((c) => c.status)).toEqual([200]);
    expect(h.fake.leaseCalls.map((c) => c.method)).toEqual(["DELETE"]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("publish → retries → dead letter → replay: the replay is delivered (no dedup key) and applied once", async () => {
    const h = await open("push");
    let broken = true;
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => {
      attempts.push(ctx.attempt);
      if (broken) throw new Error("partner down");
    });
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle(24 * 3_600_000);
    expect(attempts).toEqual([1, 2, 3, 4, 5]);
    const [letter] = await letters(consumer.name);
    expect(letter).toMatchObject({ errorClass: "exhausted", attempts: 5, status: "pending_review" });
    expect(directives(h).map((c) => c.method)).toEqual(["PATCH", "PATCH", "PATCH", "PATCH", "DELETE"]);

    broken = false;
    const ops = createOps({ db: pg.db, queue: h.queue, routes: [{ queue: consumer.queue, consumer: consumer.name }] });
    const report = await ops.deadLetters.replay([letter?.id as string], { operator: "ana", reason: "partner back" });
    expect(report.counts).toEqual({ replayed: 1 });
    const replay = h.fake.sends.at(-1);
    expect(replay).toMatchObject({ idempotencyKey: undefined, deduplicated: false });
    expect(h.fake.sends.filter((s) => !s.deduplicated)).toHaveLength(2);
    await h.settle();
    expect(attempts.at(-1)).toBe(1);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(await pg.db.select().from(processedJobs).where(eq(processedJobs.consumer, consumer.name))).toHaveLength(1);
    expect((await letters(consumer.name)).map((r) => r.status)).toEqual(["replayed"]);
  });
});

describe("the push route's lease confirmation", () => {
  /**
   * A route on its own adapter whose clock runs `skew.ms` behind the
   * service's (NTP skew), subscribed to the consumer's topic; its incidents.
   */
  function skewedRoute(
    h: VercelHarness,
    consumer: ReturnType<typeof pointsConsumer>,
    skew: { ms: number },
    leaseRenewalMs?: number,
  ) {
    const seen: VercelIncident["kind"][] = [];
    const queue = createVercelQueue({
      ...h.fake.clientOptions(),
      clock: { now: () => h.fake.clock.now() - skew.ms } as never,
      logger: silentLogger,
      env: {},
      onIncident: (incident) => void seen.push(incident.kind),
      ...(leaseRenewalMs !== undefined ? { leaseRenewalMs } : {}),
    });
    const topic = toVercelTopic(consumer.queue);
    h.fake.subscribePush(topic, queue.pushHandler(bind(consumer)), { group: "route_skewed" });
    return { topic, incidents: seen, close: () => queue.close() };
  }
  const leases = (h: VercelHarness) => h.fake.leaseCalls.map((c) => [c.method, c.visibilityTimeoutSeconds, c.status]);

  test("a confirmation answered 500 runs nothing and is a recorded hold: the redelivery runs the job as attempt 1", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => void attempts.push(ctx.attempt));
    h.subscribe(bind(consumer));
    h.fake.failLeaseCalls(1, { method: "PATCH", status: 500 });
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    expect(h.fake.callbacks.map((c) => [c.deliveryCount, c.status])).toEqual([
      [1, 500],
      [2, 200],
    ]);
    // The service counted two deliveries; the handler ran once, and that was the job's first attempt.
    expect(attempts).toEqual([1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });

  test("a confirmation refused 400 near the expiry (this clock 2 s behind the service's) is asked again with a margin off, and the job runs: not a forged callback", async () => {
    const h = await open("push");
    const attempts: number[] = [];
    const consumer = pointsConsumer((ctx) => void attempts.push(ctx.attempt));
    const route = skewedRoute(h, consumer, { ms: 2_000 });
    try {
      // 200 s of retention left: less than the 300 s lease the route asks for, so it asks up to the expiry.
      h.fake.inject(route.topic, JSON.stringify(award()), { retentionSeconds: 200 });
      await h.settle(86_400_000);
      expect(leases(h)).toEqual([
        ["PATCH", 202, 400], // up to the expiry by a clock 2 s behind: past it by the service's
        ["PATCH", 172, 200], // the same less 30 s
        ["DELETE", undefined, 204],
      ]);
      expect(attempts).toEqual([1]);
      expect(await effectRows(consumer.name)).toHaveLength(1);
      expect(route.incidents).toEqual([]);
      expect(h.fake.drops).toEqual([]);
    } finally {
      await route.close();
    }
  });

  test("a confirmation refused 400 again with the margin off (the message at its expiry): its dead letter holds the job, the service drops nothing unseen", async () => {
    const h = await open("push");
    let ran = 0;
    const consumer = pointsConsumer(() => {
      ran += 1;
    });
    // A clock a minute behind: even 30 s off the lease, it reaches past the expiry.
    const route = skewedRoute(h, consumer, { ms: 60_000 });
    try {
      h.fake.inject(route.topic, JSON.stringify(award()), { retentionSeconds: 200 });
      await h.settle(86_400_000);
      expect(leases(h)).toEqual([
        ["PATCH", 260, 400],
        ["PATCH", 230, 400],
        ["DELETE", undefined, 204],
      ]);
      expect(ran).toBe(0);
      const rows = await letters(consumer.name);
      expect(rows.map((r) => [r.errorClass, r.attempts, r.status])).toEqual([["expired", 0, "pending_review"]]);
      expect(rows[0]?.lastError).toContain("the handler did not run");
      expect(route.incidents).toEqual(["dead_lettered_before_drop"]);
      expect(h.fake.drops).toEqual([]);
    } finally {
      await route.close();
    }
  });

  test("a renewal refused 400 (this clock fell 2 s behind) is asked again with the margin off, not again and again until the expiry", async () => {
    const h = await open("push");
    const skew = { ms: 0 };
    const consumer = pointsConsumer(async () => {
      skew.ms = 2_000;
      // Real time for a few renewals (every 100 ms); the service's clock stands still.
      await new Promise((r) => setTimeout(r, 700));
    });
    const route = skewedRoute(h, consumer, skew, 100);
    try {
      h.fake.inject(route.topic, JSON.stringify(award()), { retentionSeconds: 200 });
      await h.settle(86_400_000);
      const patches = h.fake.leaseCalls.filter((c) => c.method === "PATCH");
      expect(patches[0]).toMatchObject({ visibilityTimeoutSeconds: 200, status: 200 }); // the confirmation
      expect(patches.filter((c) => c.status === 400).map((c) => c.visibilityTimeoutSeconds)).toEqual([202]);
      // Every renewal after the refusal is asked 30 s short of the expiry, and taken.
      const after = patches.slice(patches.findIndex((c) => c.status === 400) + 1);
      expect(after.length).toBeGreaterThanOrEqual(2);
      expect(after.every((c) => c.visibilityTimeoutSeconds === 172 && c.status === 200)).toBe(true);
      expect(route.incidents).toEqual(["lease_renewal_failed"]);
      expect(await effectRows(consumer.name)).toHaveLength(1);
    } finally {
      await route.close();
    }
  });

  test("a callback without its expiry (no ce-vqsexpiresat) is confirmed under the full lease, counting the retention the adapter sends with, not a lease of 0 s", async () => {
    const h = await open("push");
    let ran = 0;
    const consumer = pointsConsumer(() => {
      ran += 1;
    });
    const route = h.queue.pushHandler(bind(consumer));
    const withoutExpiry = (request: Request) => {
      const headers = new Headers(request.headers);
      headers.delete("ce-vqsexpiresat");
      return route(
        new Request(request.url, { method: "POST", headers, body: request.body, duplex: "half" } as RequestInit),
      );
    };
    h.fake.subscribePush(toVercelTopic(consumer.queue), withoutExpiry, { group: "route_noexpiry" });
    // Delivered two days after its send: past the SDK's own guess of a day's retention.
    await h.queue.schedule(consumer.queue, award(), new Date(h.fake.clock.now() + 2 * 86_400_000));
    await h.settle(3 * 86_400_000);
    expect(ran).toBe(1);
    expect(leases(h)[0]).toEqual(["PATCH", 300, 200]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
  });
});
