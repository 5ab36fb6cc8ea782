/**
 * The fake Vercel Queues server behaves like the service where the service's
 * behaviour is known (and like its pessimistic answer where it is not): the
 * real SDK is pointed at it and sees what it would see in production
 * (#11 item 7; shared/notes/vercel-queue-service.md).
 */
import { PollingQueueClient, QueueClient } from "@vercel/queue";
import { afterEach, describe, expect, test } from "vitest";
import {
  chaosFaults,
  type FakeVercelQueues,
  type FakeVercelQueuesOptions,
  startFakeVercelQueues,
} from "./fake-vercel-queues.ts";

let fake: FakeVercelQueues | undefined;
afterEach(async () => {
  await fake?.close();
  fake = undefined;
});
const start = async (options: FakeVercelQueuesOptions = {}) => {
  fake = await startFakeVercelQueues(options);
  return fake;
};
const client = (f: FakeVercelQueues) => new QueueClient({ ...f.clientOptions() });
const poller = (f: FakeVercelQueues) => new PollingQueueClient({ ...f.clientOptions() });
const fail = () => Promise.resolve(new Response("no", { status: 500 }));

describe("delivery limits (no dead-letter queue)", () => {
  test("a push subscription drops a message once its maxDeliveries are spent, and records the drop", async () => {
    const f = await start();
    f.subscribePush("t", fail, { group: "g", maxDeliveries: 3, retryAfterSeconds: 10 });
    const id = f.inject("t", "{}");
    for (let i = 0; i < 5; i++) {
      await f.dispatch();
      f.clock.advance(10_000);
    }
    expect(f.callbacks.map((c) => c.deliveryCount)).toEqual([1, 2, 3]);
    expect(f.drops).toEqual([{ topic: "t", group: "g", messageId: id, deliveryCount: 3, reason: "max_deliveries" }]);
    expect(f.pending("t", "g")).toBe(0);
  });

  test("a message is dropped at expiresAt, and a lease change past it is refused", async () => {
    const f = await start();
    const sdk = poller(f);
    await client(f).send("t", { n: 1 }, { retentionSeconds: 120 });
    let patched: unknown;
    await sdk
      .receive(
        "t",
        "g",
        () => {
          throw new Error("retry me");
        },
        {
          visibilityTimeoutSeconds: 30,
          retry: () => ({ afterSeconds: 600 }),
        },
      )
      .catch((e: unknown) => {
        patched = e;
      });
    expect(patched).toBeUndefined();
    expect(f.leaseCalls.map((c) => [c.method, c.visibilityTimeoutSeconds, c.status])).toEqual([["PATCH", 600, 400]]);
    f.clock.advance(120_000);
    expect(await sdk.receive("t", "g", () => {})).toEqual({ ok: false, reason: "empty" });
    expect(f.drops.map((d) => d.reason)).toEqual(["expired"]);
  });
});

describe("push callbacks", () => {
  test("the first push lease is 60 s, announced in ce-vqsvisibilitydeadline", async () => {
    const f = await start();
    const seen: Headers[] = [];
    f.subscribePush(
      "t",
      async (request) => {
        seen.push(request.headers);
        return new Response("late", { status: 500 });
      },
      { group: "g", retryAfterSeconds: 600 },
    );
    f.inject("t", "{}");
    const sent = f.clock.now();
    await f.dispatch();
    expect(seen[0]?.get("ce-vqsvisibilitydeadline")).toBe(new Date(sent + 60_000).toISOString());
    expect(seen[0]?.get("ce-vqsreceipthandle")).toMatch(/^rh_/);
  });

  test("push concurrency is unbounded and the order approximate (not FIFO)", async () => {
    const f = await start();
    let running = 0;
    let most = 0;
    const order: string[] = [];
    f.subscribePush(
      "t",
      async (request) => {
        running += 1;
        most = Math.max(most, running);
        order.push(await request.text());
        await new Promise((r) => setTimeout(r, 5));
        running -= 1;
        return new Response("ok");
      },
      { group: "g" },
    );
    const bodies = Array.from({ length: 20 }, (_, i) => `${i}`);
    for (const body of bodies) f.inject("t", body);
    await f.dispatch();
    expect(most).toBe(20);
    expect([...order].sort((a, b) => Number(a) - Number(b))).toEqual(bodies);
    expect(order).not.toEqual(bodies);
  });
});

describe("sends", () => {
  test("a duplicate idempotency key answers a fresh id (as vercel dev); receiving that id is a 409 naming the original", async () => {
    const f = await start();
    const sdk = client(f);
    const first = await sdk.send("t", { n: 1 }, { idempotencyKey: "k" });
    const second = await sdk.send("t", { n: 2 }, { idempotencyKey: "k" });
    expect(second.messageId).not.toBe(first.messageId);
    expect(f.sends.map((s) => s.deduplicated)).toEqual([false, true]);
    const byId = await poller(f).receive("t", "g", () => {}, { messageId: second.messageId as string });
    expect(byId).toMatchObject({ ok: false, reason: "not_available" });
  });

  test("injected faults reach the SDK as the service's answers: 202, 429, 502, 503, 500 and 413", async () => {
    const f = await start({ maxMessageBytes: 64 });
    const sdk = client(f);
    f.failNextSends(
      { status: 202 },
      { status: 429, retryAfter: 7 },
      { status: 502, errorCode: "consumer_discovery_failed" },
      { status: 503 },
      { status: 500 },
    );
    expect(await sdk.send("t", { n: 1 })).toEqual({ messageId: null });
    // The SDK reads Retry-After on lease calls only, not on a send.
    await expect(sdk.send("t", { n: 2 })).rejects.toMatchObject({ name: "TooManyRequestsError" });
    expect(f.sends[1]?.status).toBe(429);
    await expect(sdk.send("t", { n: 3 })).rejects.toMatchObject({ name: "ConsumerDiscoveryError" });
    await expect(sdk.send("t", { n: 4 })).rejects.toMatchObject({ name: "ConsumerRegistryNotConfiguredError" });
    await expect(sdk.send("t", { n: 5 })).rejects.toMatchObject({ name: "InternalServerError" });
    await expect(sdk.send("t", { big: "x".repeat(100) })).rejects.toThrow(/413|exceeds/);
    // The 202 stored its message all the same ("accepted for deferred processing").
    expect(f.sends.map((s) => s.status)).toEqual([202, 429, 502, 503, 500, 413]);
    const got: unknown[] = [];
    await poller(f).receive("t", "g", (payload) => {
      got.push(payload);
    });
    expect(got).toEqual([{ n: 1 }]);
  });

  test("failed acks and visibility changes are injectable, applied or not, and a hook can make a redelivery early", async () => {
    const f = await start();
    const sdk = poller(f);
    await client(f).send("t", { n: 1 });
    f.failLeaseCalls(1, { method: "DELETE", status: 500 });
    await expect(sdk.receive("t", "g", () => {}, { visibilityTimeoutSeconds: 30 })).rejects.toThrow(/injected 500/);
    expect(f.leaseCalls.map((c) => [c.method, c.status, c.applied])).toEqual([["DELETE", 500, false]]);
    expect(f.pending("t", "g")).toBe(1);
    // An ack whose answer is lost: applied, but the caller sees a failure.
    f.clock.advance(30_000);
    f.failLeaseCalls(1, { method: "DELETE", status: 502, apply: true });
    await expect(sdk.receive("t", "g", () => {}, { visibilityTimeoutSeconds: 30 })).rejects.toThrow(/injected 502/);
    expect(f.pending("t", "g")).toBe(0);

    await client(f).send("t", { n: 2 });
    f.faults = { earlyRedeliveryMs: () => 25_000 };
    await sdk
      .receive(
        "t",
        "g",
        () => {
          throw new Error("again");
        },
        { visibilityTimeoutSeconds: 30, retry: () => ({ afterSeconds: 30 }) },
      )
      .catch(() => {});
    f.clock.advance(5_000);
    let again = 0;
    await sdk.receive("t", "g", () => {
      again += 1;
    });
    expect(again).toBe(1);
  });
});

describe("partitions", () => {
  test("a consumer sees only its region, and only its deployment's pinned messages; strict mode hides pinned from unpinned", async () => {
    for (const deployments of ["docs", "strict"] as const) {
      const f = await start({ deployments });
      const pinned = new QueueClient({ ...f.clientOptions(), deploymentId: "dpl_A" });
      await pinned.send("t", { to: "A" });
      await new QueueClient({ ...f.clientOptions("fra1") }).send("t", { to: "fra1" });
      const read = async (options: { deploymentId: string | null; region?: string }) => {
        const got: unknown[] = [];
        const sdk = new PollingQueueClient({ ...f.clientOptions(options.region), deploymentId: options.deploymentId });
        while ((await sdk.receive("t", `g_${options.deploymentId ?? "none"}`, (p) => void got.push(p))).ok) {}
        return got;
      };
      expect(await read({ deploymentId: "dpl_B" })).toEqual([]);
      expect(await read({ deploymentId: "dpl_A" })).toEqual([{ to: "A" }]);
      expect(await read({ deploymentId: null })).toEqual(deployments === "docs" ? [{ to: "A" }] : []);
      expect(await read({ deploymentId: null, region: "fra1" })).toEqual([{ to: "fra1" }]);
      await f.close();
      fake = undefined;
    }
  });

  test("sequence ids repeat across deployments, as opaque shard sequences may", async () => {
    const f = await start({ messageIds: "sequence" });
    const a = await new QueueClient({ ...f.clientOptions(), deploymentId: "dpl_A" }).send("t", {});
    const b = await new QueueClient({ ...f.clientOptions(), deploymentId: "dpl_B" }).send("t", {});
    expect(a.messageId).toBe("0-1");
    expect(b.messageId).toBe("0-1");
  });

  test("a new poll group starts at the server default unless the receive names a cursor fallback", async () => {
    const f = await start({ cursorDefault: "latest" });
    await client(f).send("t", { old: true });
    const sdk = poller(f);
    expect(await sdk.receive("t", "late", () => {})).toEqual({ ok: false, reason: "empty" });
    const got: unknown[] = [];
    await sdk.receive("t", "early", (p) => void got.push(p), { cursorFallback: "earliest" });
    expect(got).toEqual([{ old: true }]);
    expect(f.receives.map((r) => r.cursorFallback)).toEqual([undefined, "earliest"]);
  });
});

test("an unknown token is refused with 401", async () => {
  const f = await start();
  const stale = new QueueClient({ ...f.clientOptions(), token: "expired" });
  await expect(stale.send("t", {})).rejects.toMatchObject({ name: "UnauthorizedError" });
});

test("chaosFaults drops a share of acks silently (answered 204, not applied), repeatably from its seed", async () => {
  const counts: number[] = [];
  for (let run = 0; run < 2; run++) {
    const f = await start({ faults: chaosFaults({ seed: 3, lostAcks: 0.25 }) });
    const sdk = poller(f);
    for (let i = 0; i < 40; i++) await client(f).send("t", { i });
    while ((await sdk.receive("t", "g", () => {}, { visibilityTimeoutSeconds: 30 })).ok) {}
    counts.push(f.pending("t", "g"));
    expect(f.leaseCalls.filter((c) => !c.applied).every((c) => c.status === 204)).toBe(true);
    await f.close();
    fake = undefined;
  }
  expect(counts[0]).toBeGreaterThan(0);
  expect(counts[0]).toBeLessThan(40);
  expect(counts[1]).toBe(counts[0]);
});
