/**
 * A fake Vercel Queues server for tests (not shipped). It speaks the v3 wire
 * protocol that @vercel/queue 0.6.0 uses — read from the SDK's source — on
 * 127.0.0.1 with an ephemeral port, so the REAL SDK runs against it:
 * - POST   /api/v3/topic/{topic}                                   send (Vqs-Delay-Seconds, Vqs-Retention-Seconds, Vqs-Idempotency-Key, Vqs-Deployment-Id) → 201 {messageId}
 * - POST   /api/v3/topic/{topic}/consumer/{group}                  receive (Vqs-Visibility-Timeout-Seconds, Vqs-Max-Messages, Vqs-Cursor-Fallback, Vqs-Deployment-Id) → multipart/mixed, or 204 when empty
 * - POST   /api/v3/topic/{topic}/consumer/{group}/id/{messageId}   receive one by id → multipart/mixed; 404 / 409 locked or duplicate / 410 processed
 * - PATCH  /api/v3/topic/{topic}/consumer/{group}/lease/{handle}   change visibility, body {visibilityTimeoutSeconds}
 * - DELETE /api/v3/topic/{topic}/consumer/{group}/lease/{handle}   acknowledge
 * Push delivery calls a route handler with a binary CloudEvent
 * (`ce-type: com.vercel.queue.v2beta`, `ce-vqs*` headers, the raw body) as
 * Vercel does for a vercel.json `queue/v2beta` trigger; a non-2xx answer makes
 * the message visible again after the trigger's `retryAfterSeconds`.
 *
 * It behaves like the service where the service's behaviour is known, and
 * like the pessimistic answer where it is not (shared/notes/vercel-queue-service.md,
 * ADR 0009):
 * - a subscription drops a message once its `maxDeliveries` deliveries are
 *   spent (no dead-letter queue), and every message is dropped at `expiresAt`;
 *   a lease PATCH past `expiresAt` is refused (400). Drops are recorded in `drops`;
 * - the first push lease is 60 s (`ce-vqsvisibilitydeadline`), whatever the route's own lease;
 * - order is approximate (a seeded shuffle of what is visible), push concurrency unbounded;
 * - a duplicate send (same idempotency key) answers a fresh id, as `vercel dev`
 *   does; receiving that id answers 409 with `originalMessageId`. Dedup is per
 *   region and topic (across deployments: the widest plausible scope);
 * - partitions: the region is the first path segment of the base URL
 *   (`clientOptions().resolveBaseUrl`), the deployment is `Vqs-Deployment-Id`;
 *   a consumer never sees another region's messages, nor those pinned to
 *   another deployment (and with `deployments: "strict"`, an unpinned consumer
 *   sees no pinned message and the other way round);
 * - faults are injectable (`faults`, `failSends`, `failNextSends`, `failLeaseCalls`):
 *   202 with a null id, 429 with Retry-After, 502 `consumer_discovery_failed`,
 *   503, 413 past `maxMessageBytes`, failed or lost acks and PATCHes, early redelivery.
 *
 * Time is a manual clock: leases and delays only pass when a test moves it,
 * so an unacknowledged message comes back after its visibility timeout, with
 * a higher delivery count, without anyone sleeping.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createManualClock } from "../src/clock.ts";
import {
  FAKE_MAX_MESSAGE_BYTES,
  FAKE_REGION,
  FAKE_TOKEN,
  type FakeReply,
  type FakeVercelQueues,
  type FakeVercelQueuesOptions,
  type RecordedCallback,
  type RecordedDrop,
  type RecordedLeaseCall,
  type RecordedReceive,
  type RecordedSend,
  seeded,
  TEST_QUEUE_SECRET,
} from "./fake-vercel-queues-api.ts";
import type { Delivery, GroupState, PushSubscription, StoredMessage } from "./fake-vercel-queues-state.ts";

import { intHeader, multipart, reply, replyFault } from "./fake-vercel-queues-wire.ts";

export * from "./fake-vercel-queues-api.ts";

const TOPIC = /^[A-Za-z0-9_-]+$/;
const REGION = /^[a-z]{2,5}[0-9]{1,2}$/;
const DAY_S = 86_400;
const MAX_RETENTION_S = 604_800;
const MAX_VISIBILITY_S = 3_600;

export async function startFakeVercelQueues(options: FakeVercelQueuesOptions = {}): Promise<FakeVercelQueues> {
  const clock = createManualClock(options.start ?? Date.now());
  const maxMessageBytes = options.maxMessageBytes ?? FAKE_MAX_MESSAGE_BYTES;
  const random = seeded(options.seed ?? 1);
  const strict = options.deployments === "strict";
  const messages = new Map<string, StoredMessage>(); // key → message
  const byTopic = new Map<string, StoredMessage[]>(); // region|topic → messages
  const groups = new Map<string, GroupState>(); // region|topic|group → state
  const handles = new Map<string, { group: GroupState; key: string }>();
  const dedup = new Map<string, { messageId: string; until: number }>();
  const duplicates = new Map<string, string>(); // fresh id answered for a duplicate → original id
  const sequences = new Map<string, number>();
  const sends: RecordedSend[] = [];
  const leaseCalls: RecordedLeaseCall[] = [];
  const callbacks: RecordedCallback[] = [];
  const receives: RecordedReceive[] = [];
  const drops: RecordedDrop[] = [];
  const pushes: PushSubscription[] = [];
  const sendFaults: FakeReply[] = [];
  const leaseFaults: { method?: "PATCH" | "DELETE"; status: number; apply: boolean }[] = [];
  let seq = 0;
  let order = 0;

  const topicKey = (region: string, topic: string) => `${region}|${topic}`;
  /** Whether a consumer of `consumerDeployment` may see a message sent with `messageDeployment`. */
  const canSee = (consumerDeployment: string | null | undefined, messageDeployment: string | null) => {
    if (consumerDeployment === undefined) return true; // a push subscription of every partition
    if (consumerDeployment === messageDeployment) return true;
    if (strict) return false;
    // docs: "omit the deployment ID: poll across all deployments"; a pinned consumer also sees unpinned sends.
    return consumerDeployment === null || messageDeployment === null;
  };

  const groupOf = (
    region: string,
    topic: string,
    name: string,
    start: "earliest" | "latest" = "earliest",
  ): GroupState => {
    const id = `${region}|${topic}|${name}`;
    let group = groups.get(id);
    if (!group) {
      group = {
        region,
        topic,
        name,
        fromSeq: start === "latest" ? seq : 0,
        deliveries: new Map(),
        maxDeliveries: options.pollMaxDeliveries,
      };
      // A new consumer group starts from the earliest retained message (or the next one, `latest`).
      for (const m of byTopic.get(topicKey(region, topic)) ?? []) {
        if (m.seq >= group.fromSeq) group.deliveries.set(m.key, newDelivery(m));
      }
      groups.set(id, group);
    }
    return group;
  };

  const newDelivery = (m: StoredMessage): Delivery => ({
    deliveryCount: 0,
    visibleAt: m.availableAt,
    receiptHandle: undefined,
    acked: false,
    dropped: false,
  });

  const nextId = (region: string, deploymentId: string | null, topic: string): string => {
    if (options.messageIds !== "sequence") return `msg_${randomUUID()}`;
    const partition = `${region}|${deploymentId ?? ""}|${topic}`;
    const n = (sequences.get(partition) ?? 0) + 1;
    sequences.set(partition, n);
    return `0-${n}`;
  };

  const store = (
    region: string,
    deploymentId: string | null,
    topic: string,
    body: Buffer,
    contentType: string,
    delayS: number,
    retentionS: number,
  ): StoredMessage => {
    const now = clock.now();
    const id = nextId(region, deploymentId, topic);
    const m: StoredMessage = {
      key: `${region}|${deploymentId ?? ""}|${topic}|${id}`,
      id,
      seq: seq++,
      region,
      deploymentId,
      topic,
      body,
      contentType,
      createdAt: now,
      availableAt: now + delayS * 1000,
      expiresAt: now + retentionS * 1000,
    };
    messages.set(m.key, m);
    const list = byTopic.get(topicKey(region, topic)) ?? [];
    list.push(m);
    byTopic.set(topicKey(region, topic), list);
    for (const group of groups.values()) {
      if (group.region === region && group.topic === topic) group.deliveries.set(m.key, newDelivery(m));
    }
    return m;
  };

  /** Drops what the service would have dropped by now; true when the delivery is still alive. */
  const alive = (group: GroupState, m: StoredMessage, d: Delivery): boolean => {
    if (d.acked || d.dropped) return false;
    const now = clock.now();
    if (m.expiresAt <= now) {
      d.dropped = true;
      drops.push({
        topic: m.topic,
        group: group.name,
        messageId: m.id,
        deliveryCount: d.deliveryCount,
        reason: "expired",
      });
      return false;
    }
    if (group.maxDeliveries !== undefined && d.deliveryCount >= group.maxDeliveries && d.visibleAt <= now) {
      // Its last permitted delivery ended without an acknowledgement: there is no dead-letter queue.
      d.dropped = true;
      if (d.receiptHandle) handles.delete(d.receiptHandle);
      d.receiptHandle = undefined;
      drops.push({
        topic: m.topic,
        group: group.name,
        messageId: m.id,
        deliveryCount: d.deliveryCount,
        reason: "max_deliveries",
      });
      return false;
    }
    return true;
  };

  const visible = (group: GroupState, deploymentId: string | null | undefined): [StoredMessage, Delivery][] => {
    const now = clock.now();
    const out: [StoredMessage, Delivery][] = [];
    for (const [key, d] of group.deliveries) {
      const m = messages.get(key);
      if (!m || !alive(group, m, d) || d.visibleAt > now || !canSee(deploymentId, m.deploymentId)) continue;
      out.push([m, d]);
    }
    out.sort((a, b) => a[1].visibleAt - b[1].visibleAt || a[0].seq - b[0].seq);
    if (options.order !== "fifo") {
      // Approximate order, as the service promises: a seeded shuffle.
      for (let i = out.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1));
        [out[i], out[j]] = [out[j] as [StoredMessage, Delivery], out[i] as [StoredMessage, Delivery]];
      }
    }
    return out;
  };

  const setVisibleAt = (group: GroupState, m: StoredMessage, d: Delivery, at: number) => {
    const early = fake.faults.earlyRedeliveryMs;
    const shift = early ? Math.max(0, early({ topic: m.topic, group: group.name, messageId: m.id })) : 0;
    d.visibleAt = Math.max(clock.now(), at - shift);
  };

  const lease = (group: GroupState, m: StoredMessage, d: Delivery, seconds: number): string => {
    if (d.receiptHandle) handles.delete(d.receiptHandle);
    d.deliveryCount += 1;
    setVisibleAt(group, m, d, clock.now() + seconds * 1000);
    d.receiptHandle = `rh_${randomUUID()}`;
    handles.set(d.receiptHandle, { group, key: m.key });
    return d.receiptHandle;
  };

  const findMessage = (region: string, topic: string, id: string, deploymentId: string | null) => {
    const candidates = (byTopic.get(topicKey(region, topic)) ?? []).filter(
      (m) => m.id === id && canSee(deploymentId, m.deploymentId),
    );
    return candidates.find((m) => m.deploymentId === deploymentId) ?? candidates[0];
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    if (req.headers.authorization !== `Bearer ${FAKE_TOKEN}`) return reply(res, 401, "Missing or invalid token");
    const url = new URL(req.url ?? "/", "http://fake");
    const parts = url.pathname.split("/").map(decodeURIComponent);
    let region = FAKE_REGION;
    if (REGION.test(parts[1] ?? "")) region = parts.splice(1, 1)[0] as string;
    const deploymentHeader = req.headers["vqs-deployment-id"];
    const deploymentId = typeof deploymentHeader === "string" && deploymentHeader !== "" ? deploymentHeader : null;
    // ["", "api", "v3", "topic", topic, "consumer", group, ...]
    if (parts[1] !== "api" || parts[2] !== "v3" || parts[3] !== "topic") return reply(res, 404, "not found");
    const topic = parts[4] ?? "";
    if (!TOPIC.test(topic)) return reply(res, 400, `invalid topic name ${JSON.stringify(topic)}`);

    if (parts.length === 5 && req.method === "POST") {
      const delay = intHeader(req, "Vqs-Delay-Seconds");
      const retention = intHeader(req, "Vqs-Retention-Seconds");
      const key = req.headers["vqs-idempotency-key"] as string | undefined;
      const record = (messageId: string, deduplicated: boolean, status: number) =>
        sends.push({
          order: order++,
          topic,
          region,
          deploymentId,
          messageId,
          idempotencyKey: key,
          delaySeconds: typeof delay === "number" ? delay : undefined,
          retentionSeconds: typeof retention === "number" ? retention : undefined,
          deduplicated,
          status,
          body,
        });
      const fault = sendFaults.shift() ?? fake.faults.send?.({ topic, body, idempotencyKey: key });
      if (fault?.delayMs !== undefined) await new Promise((resolve) => setTimeout(resolve, fault.delayMs));
      if (fault?.dropConnection === "before") {
        record("", false, 0);
        res.socket?.destroy();
        return;
      }
      if (fault?.status === 202 && fault.store === false) {
        record("", false, 202);
        return reply(res, 202, { status: "accepted" });
      }
      if (fault?.body !== undefined) {
        record("", false, fault.status);
        return reply(res, fault.status, fault.body);
      }
      if (fault && fault.status !== 202 && fault.status !== 201) {
        record("", false, fault.status);
        return replyFault(res, fault);
      }
      if (body.length > maxMessageBytes) {
        record("", false, 413);
        return reply(res, 413, `message of ${body.length} bytes exceeds the limit of ${maxMessageBytes}`);
      }
      if (delay === "bad" || retention === "bad") return reply(res, 400, "delay and retention are integers");
      const retentionS = retention ?? DAY_S;
      const delayS = delay ?? 0;
      if (retentionS < 60 || retentionS > MAX_RETENTION_S) return reply(res, 400, "retention out of range");
      if (delayS < 0 || delayS > MAX_RETENTION_S || delayS > retentionS) return reply(res, 400, "delay out of range");
      if (key !== undefined && key.length > 256) return reply(res, 400, "idempotency key too long");
      const now = clock.now();
      const dedupKey = `${region}\u0000${topic}\u0000${key}`;
      if (key !== undefined) {
        const seen = dedup.get(dedupKey);
        if (seen && seen.until > now) {
          // As `vercel dev`: a fresh id, nothing stored; the duplicate is dropped out of band.
          const fresh = nextId(region, deploymentId, topic);
          duplicates.set(fresh, seen.messageId);
          record(fresh, true, 201);
          return reply(res, 201, { messageId: fresh });
        }
      }
      const m = store(
        region,
        deploymentId,
        topic,
        body,
        String(req.headers["content-type"] ?? "application/octet-stream"),
        delayS,
        retentionS,
      );
      if (key !== undefined) dedup.set(dedupKey, { messageId: m.id, until: now + Math.min(retentionS, DAY_S) * 1000 });
      if (fault?.status === 202) {
        record(m.id, false, 202);
        return reply(res, 202, { status: "accepted" });
      }
      if (fault?.dropConnection === "after") {
        record(m.id, false, 0);
        res.socket?.destroy();
        return;
      }
      record(m.id, false, 201);
      return reply(res, 201, { messageId: m.id });
    }

    if (parts[5] !== "consumer" || !TOPIC.test(parts[6] ?? "")) return reply(res, 404, "not found");
    const groupName = parts[6] as string;

    if (parts.length === 7 && req.method === "POST") {
      const vt = intHeader(req, "Vqs-Visibility-Timeout-Seconds");
      const max = intHeader(req, "Vqs-Max-Messages");
      const fallback = req.headers["vqs-cursor-fallback"] as string | undefined;
      const recordReceive = (status: number) =>
        receives.push({ topic, group: groupName, region, deploymentId, cursorFallback: fallback, status });
      if (vt === "bad" || max === "bad" || (max !== undefined && (max < 1 || max > 10))) {
        recordReceive(400);
        return reply(res, 400, "bad receive parameters");
      }
      const start = fallback === "earliest" || fallback === "latest" ? fallback : (options.cursorDefault ?? "earliest");
      const group = groupOf(region, topic, groupName, start);
      const batch = visible(group, deploymentId).slice(0, max ?? 1);
      if (batch.length === 0) {
        recordReceive(204);
        return reply(res, 204);
      }
      for (const [m, d] of batch) lease(group, m, d, vt ?? 60);
      recordReceive(200);
      return multipart(res, batch);
    }

    if (parts.length === 9 && parts[7] === "id" && req.method === "POST") {
      const id = parts[8] as string;
      const original = duplicates.get(id);
      if (original !== undefined) return reply(res, 409, { error: "duplicate", originalMessageId: original });
      const m = findMessage(region, topic, id, deploymentId);
      const group = groupOf(region, topic, groupName);
      const d = m ? group.deliveries.get(m.key) : undefined;
      if (!m || !d || m.expiresAt <= clock.now()) return reply(res, 404, "message not found");
      if (d.acked) return reply(res, 410, "already processed");
      if (d.dropped) return reply(res, 404, "message not found");
      if (d.visibleAt > clock.now()) return reply(res, 409, "message locked");
      const vt = intHeader(req, "Vqs-Visibility-Timeout-Seconds");
      lease(group, m, d, typeof vt === "number" ? vt : 60);
      return multipart(res, [[m, d]]);
    }

    if (parts.length === 9 && parts[7] === "lease" && (req.method === "PATCH" || req.method === "DELETE")) {
      const method = req.method as "PATCH" | "DELETE";
      const handleId = parts[8] as string;
      const owner = handles.get(handleId);
      const d = owner?.group.deliveries.get(owner.key);
      const m = owner ? messages.get(owner.key) : undefined;
      let seconds: unknown;
      if (method === "PATCH") {
        try {
          seconds = (JSON.parse(body.toString("utf8")) as { visibilityTimeoutSeconds?: unknown })
            .visibilityTimeoutSeconds;
        } catch {}
      }
      const call = (status: number, applied: boolean) => {
        leaseCalls.push({
          order: order++,
          method,
          topic,
          group: groupName,
          messageId: m?.id ?? "",
          status,
          applied,
          ...(method === "PATCH" && typeof seconds === "number" ? { visibilityTimeoutSeconds: seconds } : {}),
        });
      };
      if (!owner || !d || !m || owner.group.topic !== topic || owner.group.name !== groupName) {
        call(404, false);
        return reply(res, 404, "receipt handle not found");
      }
      if (d.acked || d.dropped || d.receiptHandle !== handleId) {
        call(409, false);
        return reply(res, 409, "lease lost");
      }
      if (m.expiresAt <= clock.now()) {
        call(404, false);
        return reply(res, 404, "message expired");
      }
      if (
        method === "PATCH" &&
        (typeof seconds !== "number" || !Number.isInteger(seconds) || seconds < 0 || seconds > MAX_VISIBILITY_S)
      ) {
        call(400, false);
        return reply(res, 400, "visibilityTimeoutSeconds must be an integer in 0..3600");
      }
      if (method === "PATCH" && clock.now() + (seconds as number) * 1000 > m.expiresAt) {
        call(400, false);
        return reply(res, 400, "visibility timeout cannot extend beyond the message's expiration time");
      }
      const queued = leaseFaults.findIndex((f) => f.method === undefined || f.method === method);
      const injected =
        queued >= 0
          ? leaseFaults.splice(queued, 1)[0]
          : await fake.faults.leaseCall?.({
              method,
              topic,
              group: groupName,
              messageId: m.id,
              ...(method === "PATCH" ? { visibilityTimeoutSeconds: seconds as number } : {}),
            });
      // A slow call may find its lease gone by the time it lands.
      if (d.acked || d.dropped || d.receiptHandle !== handleId) {
        call(409, false);
        return reply(res, 409, "lease lost");
      }
      const apply = injected === undefined || injected.apply === true;
      if (apply) {
        if (method === "DELETE") {
          d.acked = true;
          d.receiptHandle = undefined;
          handles.delete(handleId);
        } else {
          setVisibleAt(owner.group, m, d, clock.now() + (seconds as number) * 1000);
        }
      }
      if (injected) {
        call(injected.status, apply);
        return replyFault(res, injected);
      }
      call(method === "DELETE" ? 204 : 200, true);
      return method === "DELETE" ? reply(res, 204) : reply(res, 200, { success: true });
    }
    return reply(res, 404, "not found");
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) reply(res, 500, String(error));
      else res.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const url = `http://127.0.0.1:${port}`;

  const callback = async (sub: PushSubscription, group: GroupState, m: StoredMessage, d: Delivery): Promise<void> => {
    const headers: Record<string, string> = {
      "ce-type": "com.vercel.queue.v2beta",
      "ce-specversion": "1.0",
      "ce-id": m.id,
      "ce-source": `/topic/${sub.topic}`,
      "ce-vqsqueuename": sub.topic,
      "ce-vqsconsumergroup": sub.group,
      "ce-vqsmessageid": m.id,
      "ce-vqsregion": sub.region,
    };
    let handleId: string | undefined;
    let body: Buffer | undefined;
    if (sub.mode === "inline") {
      // The server leases the message before it calls the route, for its own (short) lease.
      handleId = lease(group, m, d, sub.leaseSeconds);
      Object.assign(headers, {
        "ce-vqsreceipthandle": handleId,
        "ce-vqsdeliverycount": String(d.deliveryCount),
        "ce-vqscreatedat": new Date(m.createdAt).toISOString(),
        "ce-vqsexpiresat": new Date(m.expiresAt).toISOString(),
        "ce-vqsvisibilitydeadline": new Date(clock.now() + sub.leaseSeconds * 1000).toISOString(),
        "content-type": m.contentType,
      });
      body = m.body;
    }
    // In by-id mode the SDK leases the message itself (receive by id) before running the handler.
    const request = new Request(`http://route.invalid/${sub.group}`, {
      method: "POST",
      headers,
      ...(body ? { body: new Uint8Array(body) } : {}),
    });
    let status: number;
    try {
      const response = await sub.route(request);
      await response.text();
      status = response.status;
    } catch {
      status = 599;
    }
    callbacks.push({ topic: sub.topic, group: sub.group, messageId: m.id, deliveryCount: d.deliveryCount, status });
    const current = handleId ?? d.receiptHandle;
    // A failed callback: Vercel redelivers after the trigger's retryAfterSeconds.
    if ((status < 200 || status > 299) && !d.acked && d.receiptHandle === current) {
      setVisibleAt(group, m, d, clock.now() + sub.retryAfterSeconds * 1000);
    }
  };

  const allDeliveries = function* (): Generator<[GroupState, StoredMessage, Delivery]> {
    for (const group of groups.values()) {
      for (const [key, d] of group.deliveries) {
        const m = messages.get(key);
        if (m) yield [group, m, d];
      }
    }
  };

  const fake: FakeVercelQueues = {
    url,
    clock,
    sends,
    leaseCalls,
    callbacks,
    receives,
    drops,
    faults: options.faults ?? {},
    clientOptions: (clientRegion = FAKE_REGION) => ({
      region: clientRegion,
      token: FAKE_TOKEN,
      deploymentId: null,
      // The region is the first path segment, so the fake keeps regions apart.
      resolveBaseUrl: (r: string) => new URL(`${url}/${r}`),
      wrapperSecret: TEST_QUEUE_SECRET,
    }),
    inject(topic, body, injectOptions = {}) {
      return store(
        injectOptions.region ?? FAKE_REGION,
        injectOptions.deploymentId ?? null,
        topic,
        Buffer.from(body),
        injectOptions.contentType ?? "application/json",
        injectOptions.delaySeconds ?? 0,
        injectOptions.retentionSeconds ?? DAY_S,
      ).id;
    },
    subscribePush(topic, route, subscribeOptions = {}) {
      const region = subscribeOptions.region ?? FAKE_REGION;
      const name = subscribeOptions.group ?? `app_Sapi_Squeues_S${topic}_Sroute_Dts`;
      const group = groupOf(region, topic, name);
      group.maxDeliveries = subscribeOptions.maxDeliveries ?? 32;
      pushes.push({
        topic,
        group: name,
        region,
        deploymentId: subscribeOptions.deploymentId ?? null,
        route,
        retryAfterSeconds: subscribeOptions.retryAfterSeconds ?? 60,
        leaseSeconds: subscribeOptions.leaseSeconds ?? subscribeOptions.visibilityTimeoutSeconds ?? 60,
        mode: subscribeOptions.mode ?? "inline",
      });
    },
    setMaxDeliveries(topic, group, maxDeliveries, region = FAKE_REGION) {
      groupOf(region, topic, group).maxDeliveries = maxDeliveries;
    },
    async dispatch(dispatchOptions = {}) {
      let made = 0;
      for (;;) {
        const due: [PushSubscription, GroupState, StoredMessage, Delivery][] = [];
        for (const sub of pushes) {
          const group = groupOf(sub.region, sub.topic, sub.group);
          // A route of one deployment gets that deployment's messages; null: every partition.
          const deployment = sub.deploymentId === null ? undefined : sub.deploymentId;
          for (const [m, d] of visible(group, deployment)) due.push([sub, group, m, d]);
        }
        if (due.length === 0) return made;
        let next = 0;
        const lane = async () => {
          while (next < due.length) {
            const [sub, group, m, d] = due[next++] as [PushSubscription, GroupState, StoredMessage, Delivery];
            // Another lane's callback may have changed it (e.g. a republish made it visible later).
            if (!alive(group, m, d) || d.visibleAt > clock.now()) continue;
            made += 1;
            await callback(sub, group, m, d);
          }
        };
        const lanes = Math.min(due.length, dispatchOptions.concurrency ?? due.length);
        await Promise.all(Array.from({ length: lanes }, lane));
      }
    },
    pending(topic, group) {
      // A group nobody consumed yet: it will start at the earliest message.
      if (![...groups.values()].some((g) => g.topic === topic && g.name === group)) groupOf(FAKE_REGION, topic, group);
      let n = 0;
      for (const [g, m, d] of allDeliveries()) {
        if (g.topic === topic && g.name === group && alive(g, m, d)) n += 1;
      }
      return n;
    },
    nextVisibleAt() {
      let next: number | undefined;
      for (const [g, m, d] of allDeliveries()) {
        if (!alive(g, m, d)) continue;
        // A message whose last delivery ends is dropped then: that moment matters too.
        const at = Math.min(d.visibleAt, m.expiresAt);
        if (next === undefined || at < next) next = at;
      }
      return next;
    },
    deliveryCount(topic, group, messageId) {
      for (const [g, m, d] of allDeliveries()) {
        if (g.topic === topic && g.name === group && m.id === messageId) return d.deliveryCount;
      }
      return undefined;
    },
    failSends(n) {
      for (let i = 0; i < n; i++) sendFaults.push({ status: 500 });
    },
    failNextSends(...replies) {
      sendFaults.push(...replies);
    },
    failLeaseCalls(n, failOptions = {}) {
      for (let i = 0; i < n; i++) {
        leaseFaults.push({
          ...(failOptions.method ? { method: failOptions.method } : {}),
          status: failOptions.status ?? 500,
          apply: failOptions.apply === true,
        });
      }
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
  return fake;
}
