/**
 * A fake Vercel Queues server for tests (not shipped). It speaks the v3 wire
 * protocol that @vercel/queue 0.6.0 uses — read from the SDK's source — on
 * 127.0.0.1 with an ephemeral port, so the REAL SDK runs against it:
 * - POST   /api/v3/topic/{topic}                                   send (Vqs-Delay-Seconds, Vqs-Retention-Seconds, Vqs-Idempotency-Key) → 201 {messageId}
 * - POST   /api/v3/topic/{topic}/consumer/{group}                  receive (Vqs-Visibility-Timeout-Seconds, Vqs-Max-Messages) → multipart/mixed, or 204 when empty
 * - POST   /api/v3/topic/{topic}/consumer/{group}/id/{messageId}   receive one by id → multipart/mixed; 404 / 409 locked / 410 processed
 * - PATCH  /api/v3/topic/{topic}/consumer/{group}/lease/{handle}   change visibility, body {visibilityTimeoutSeconds}
 * - DELETE /api/v3/topic/{topic}/consumer/{group}/lease/{handle}   acknowledge
 * Push delivery calls a route handler with a binary CloudEvent
 * (`ce-type: com.vercel.queue.v2beta`, `ce-vqs*` headers, the raw body) as
 * Vercel does for a vercel.json `queue/v2beta` trigger; a non-2xx answer makes
 * the message visible again after the trigger's `retryAfterSeconds`.
 *
 * Time is a manual clock: leases and delays only pass when a test moves it,
 * so an unacknowledged message comes back after its visibility timeout, with
 * a higher delivery count, without anyone sleeping.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createManualClock, type ManualClock } from "../src/clock.ts";

const TOPIC = /^[A-Za-z0-9_-]+$/;
const DAY_S = 86_400;
const MAX_RETENTION_S = 604_800;
const MAX_VISIBILITY_S = 3_600;
export const FAKE_TOKEN = "test";
export const FAKE_REGION = "iad1";

export interface RecordedSend {
  /** Position among every recorded send and lease call, to check what happened first. */
  readonly order: number;
  readonly topic: string;
  readonly messageId: string;
  readonly idempotencyKey: string | undefined;
  readonly delaySeconds: number | undefined;
  readonly retentionSeconds: number | undefined;
  /** True when the idempotency key matched an earlier send: nothing new was stored. */
  readonly deduplicated: boolean;
  readonly body: Buffer;
}

export interface RecordedLeaseCall {
  readonly order: number;
  readonly method: "PATCH" | "DELETE";
  readonly topic: string;
  readonly group: string;
  readonly messageId: string;
  /** PATCH only. */
  readonly visibilityTimeoutSeconds?: number;
  readonly status: number;
}

export interface RecordedCallback {
  readonly topic: string;
  readonly group: string;
  readonly messageId: string;
  readonly deliveryCount: number;
  readonly status: number;
}

interface StoredMessage {
  readonly id: string;
  readonly seq: number;
  readonly topic: string;
  readonly body: Buffer;
  readonly contentType: string;
  readonly createdAt: number;
  readonly availableAt: number;
  readonly expiresAt: number;
}

interface Delivery {
  deliveryCount: number;
  visibleAt: number;
  receiptHandle: string | undefined;
  acked: boolean;
}

interface PushSubscription {
  readonly topic: string;
  readonly group: string;
  readonly route: (request: Request) => Promise<Response>;
  readonly retryAfterSeconds: number;
  readonly visibilityTimeoutSeconds: number;
  /** `inline`: body and receipt handle in the callback; `by-id`: routing only, the SDK receives by id. */
  readonly mode: "inline" | "by-id";
}

export interface FakeVercelQueues {
  readonly url: string;
  readonly clock: ManualClock;
  readonly sends: readonly RecordedSend[];
  readonly leaseCalls: readonly RecordedLeaseCall[];
  readonly callbacks: readonly RecordedCallback[];
  /** What to give the SDK (or `createVercelQueue`) to talk to this server. */
  clientOptions(): {
    region: string;
    token: string;
    deploymentId: null;
    resolveBaseUrl: (region: string) => URL;
  };
  /** Stores a message as if a producer on another stack had sent these bytes (no validation). */
  inject(topic: string, body: string | Uint8Array): string;
  /** Delivers `topic` to `route` as consumer group `group` whenever `dispatch()` runs. */
  subscribePush(
    topic: string,
    route: (request: Request) => Promise<Response>,
    options?: {
      group?: string;
      retryAfterSeconds?: number;
      visibilityTimeoutSeconds?: number;
      mode?: "inline" | "by-id";
    },
  ): void;
  /** Calls the push routes for every message visible now, repeatedly, until none is. Returns the callbacks made. */
  dispatch(options?: { concurrency?: number }): Promise<number>;
  /** Messages of `topic` not yet acknowledged by `group` (and not expired). */
  pending(topic: string, group: string): number;
  /** Earliest time a known group's unacknowledged message becomes visible, or undefined. */
  nextVisibleAt(): number | undefined;
  /** The delivery count a group has reached for a message. */
  deliveryCount(topic: string, group: string, messageId: string): number | undefined;
  /** The next `n` sends answer 500. */
  failSends(n: number): void;
  close(): Promise<void>;
}

export async function startFakeVercelQueues(options: { start?: number } = {}): Promise<FakeVercelQueues> {
  const clock = createManualClock(options.start ?? Date.now());
  const messages = new Map<string, StoredMessage>();
  const topics = new Map<string, StoredMessage[]>();
  const groups = new Map<string, Map<string, Map<string, Delivery>>>(); // topic → group → messageId → delivery
  const handles = new Map<string, { topic: string; group: string; messageId: string }>();
  const dedup = new Map<string, { messageId: string; until: number }>();
  const sends: RecordedSend[] = [];
  const leaseCalls: RecordedLeaseCall[] = [];
  const callbacks: RecordedCallback[] = [];
  const pushes: PushSubscription[] = [];
  let seq = 0;
  let order = 0;
  let failingSends = 0;

  const groupOf = (topic: string, group: string): Map<string, Delivery> => {
    let byGroup = groups.get(topic);
    if (!byGroup) {
      byGroup = new Map();
      groups.set(topic, byGroup);
    }
    let deliveries = byGroup.get(group);
    if (!deliveries) {
      // A new consumer group starts from the earliest retained message.
      deliveries = new Map();
      for (const m of topics.get(topic) ?? []) {
        deliveries.set(m.id, { deliveryCount: 0, visibleAt: m.availableAt, receiptHandle: undefined, acked: false });
      }
      byGroup.set(group, deliveries);
    }
    return deliveries;
  };

  const store = (
    topic: string,
    body: Buffer,
    contentType: string,
    delayS: number,
    retentionS: number,
  ): StoredMessage => {
    const now = clock.now();
    const m: StoredMessage = {
      id: `msg_${randomUUID()}`,
      seq: seq++,
      topic,
      body,
      contentType,
      createdAt: now,
      availableAt: now + delayS * 1000,
      expiresAt: now + retentionS * 1000,
    };
    messages.set(m.id, m);
    const list = topics.get(topic) ?? [];
    list.push(m);
    topics.set(topic, list);
    for (const deliveries of groups.get(topic)?.values() ?? []) {
      deliveries.set(m.id, { deliveryCount: 0, visibleAt: m.availableAt, receiptHandle: undefined, acked: false });
    }
    return m;
  };

  const visible = (topic: string, group: string): [StoredMessage, Delivery][] => {
    const now = clock.now();
    const out: [StoredMessage, Delivery][] = [];
    for (const [id, d] of groupOf(topic, group)) {
      const m = messages.get(id);
      if (!m || d.acked || m.expiresAt <= now || d.visibleAt > now) continue;
      out.push([m, d]);
    }
    return out.sort((a, b) => a[1].visibleAt - b[1].visibleAt || a[0].seq - b[0].seq);
  };

  const lease = (topic: string, group: string, m: StoredMessage, d: Delivery, seconds: number): string => {
    if (d.receiptHandle) handles.delete(d.receiptHandle);
    d.deliveryCount += 1;
    d.visibleAt = clock.now() + seconds * 1000;
    d.receiptHandle = `rh_${randomUUID()}`;
    handles.set(d.receiptHandle, { topic, group, messageId: m.id });
    return d.receiptHandle;
  };

  const multipart = (res: ServerResponse, parts: [StoredMessage, Delivery][]) => {
    const boundary = `fake-${randomUUID()}`;
    const chunks: Buffer[] = [];
    for (const [m, d] of parts) {
      const headers = [
        `Vqs-Message-Id: ${m.id}`,
        `Vqs-Delivery-Count: ${d.deliveryCount}`,
        `Vqs-Timestamp: ${new Date(m.createdAt).toISOString()}`,
        `Content-Type: ${m.contentType}`,
        `Vqs-Receipt-Handle: ${d.receiptHandle}`,
        `Vqs-Expires-At: ${new Date(m.expiresAt).toISOString()}`,
      ];
      chunks.push(Buffer.from(`--${boundary}\r\n${headers.join("\r\n")}\r\n\r\n`), m.body, Buffer.from("\r\n"));
    }
    chunks.push(Buffer.from(`--${boundary}--\r\n`));
    res.writeHead(200, { "content-type": `multipart/mixed; boundary=${boundary}` });
    res.end(Buffer.concat(chunks));
  };

  const reply = (res: ServerResponse, status: number, body?: unknown) => {
    if (body === undefined) {
      res.writeHead(status);
      res.end();
      return;
    }
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };

  const intHeader = (req: IncomingMessage, name: string): number | undefined | "bad" => {
    const raw = req.headers[name.toLowerCase()];
    if (raw === undefined) return undefined;
    const n = Number(raw);
    return Number.isInteger(n) ? n : "bad";
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    if (req.headers.authorization !== `Bearer ${FAKE_TOKEN}`) return reply(res, 401, "Missing or invalid token");
    const url = new URL(req.url ?? "/", "http://fake");
    const parts = url.pathname.split("/").map(decodeURIComponent);
    // ["", "api", "v3", "topic", topic, "consumer", group, ...]
    if (parts[1] !== "api" || parts[2] !== "v3" || parts[3] !== "topic") return reply(res, 404, "not found");
    const topic = parts[4] ?? "";
    if (!TOPIC.test(topic)) return reply(res, 400, `invalid topic name ${JSON.stringify(topic)}`);

    if (parts.length === 5 && req.method === "POST") {
      if (failingSends > 0) {
        failingSends -= 1;
        return reply(res, 500, "injected failure");
      }
      const delay = intHeader(req, "Vqs-Delay-Seconds");
      const retention = intHeader(req, "Vqs-Retention-Seconds");
      const key = req.headers["vqs-idempotency-key"] as string | undefined;
      if (delay === "bad" || retention === "bad") return reply(res, 400, "delay and retention are integers");
      const retentionS = retention ?? DAY_S;
      const delayS = delay ?? 0;
      if (retentionS < 60 || retentionS > MAX_RETENTION_S) return reply(res, 400, "retention out of range");
      if (delayS < 0 || delayS > MAX_RETENTION_S || delayS > retentionS) return reply(res, 400, "delay out of range");
      if (key !== undefined && key.length > 256) return reply(res, 400, "idempotency key too long");
      const record = (messageId: string, deduplicated: boolean) =>
        sends.push({
          order: order++,
          topic,
          messageId,
          idempotencyKey: key,
          delaySeconds: delay,
          retentionSeconds: retention,
          deduplicated,
          body,
        });
      const now = clock.now();
      if (key !== undefined) {
        const seen = dedup.get(`${topic}\u0000${key}`);
        if (seen && seen.until > now) {
          record(seen.messageId, true);
          return reply(res, 200, { messageId: seen.messageId });
        }
      }
      const m = store(
        topic,
        body,
        String(req.headers["content-type"] ?? "application/octet-stream"),
        delayS,
        retentionS,
      );
      if (key !== undefined) {
        dedup.set(`${topic}\u0000${key}`, { messageId: m.id, until: now + Math.min(retentionS, DAY_S) * 1000 });
      }
      record(m.id, false);
      return reply(res, 201, { messageId: m.id });
    }

    if (parts[5] !== "consumer" || !TOPIC.test(parts[6] ?? "")) return reply(res, 404, "not found");
    const group = parts[6] as string;

    if (parts.length === 7 && req.method === "POST") {
      const vt = intHeader(req, "Vqs-Visibility-Timeout-Seconds");
      const max = intHeader(req, "Vqs-Max-Messages");
      if (vt === "bad" || max === "bad" || (max !== undefined && (max < 1 || max > 10))) {
        return reply(res, 400, "bad receive parameters");
      }
      const batch = visible(topic, group).slice(0, max ?? 1);
      if (batch.length === 0) return reply(res, 204);
      for (const [m, d] of batch) lease(topic, group, m, d, vt ?? 300);
      return multipart(res, batch);
    }

    if (parts.length === 9 && parts[7] === "id" && req.method === "POST") {
      const m = messages.get(parts[8] as string);
      const d = m && m.topic === topic ? groupOf(topic, group).get(m.id) : undefined;
      if (!m || !d || m.expiresAt <= clock.now()) return reply(res, 404, "message not found");
      if (d.acked) return reply(res, 410, "already processed");
      if (d.visibleAt > clock.now()) return reply(res, 409, "message locked");
      const vt = intHeader(req, "Vqs-Visibility-Timeout-Seconds");
      lease(topic, group, m, d, typeof vt === "number" ? vt : 300);
      return multipart(res, [[m, d]]);
    }

    if (parts.length === 9 && parts[7] === "lease" && (req.method === "PATCH" || req.method === "DELETE")) {
      const handleId = parts[8] as string;
      const owner = handles.get(handleId);
      const d = owner ? groupOf(owner.topic, owner.group).get(owner.messageId) : undefined;
      const call = (status: number, visibilityTimeoutSeconds?: number) => {
        leaseCalls.push({
          order: order++,
          method: req.method as "PATCH" | "DELETE",
          topic,
          group,
          messageId: owner?.messageId ?? "",
          status,
          ...(visibilityTimeoutSeconds !== undefined ? { visibilityTimeoutSeconds } : {}),
        });
      };
      if (!owner || !d || owner.topic !== topic || owner.group !== group) {
        call(404);
        return reply(res, 404, "receipt handle not found");
      }
      if (d.acked || d.receiptHandle !== handleId) {
        call(409);
        return reply(res, 409, "lease lost");
      }
      if (req.method === "DELETE") {
        d.acked = true;
        d.receiptHandle = undefined;
        handles.delete(handleId);
        call(204);
        return reply(res, 204);
      }
      let seconds: unknown;
      try {
        seconds = (JSON.parse(body.toString("utf8")) as { visibilityTimeoutSeconds?: unknown })
          .visibilityTimeoutSeconds;
      } catch {}
      if (typeof seconds !== "number" || !Number.isInteger(seconds) || seconds < 0 || seconds > MAX_VISIBILITY_S) {
        call(400);
        return reply(res, 400, "visibilityTimeoutSeconds must be an integer in 0..3600");
      }
      d.visibleAt = clock.now() + seconds * 1000;
      call(200, seconds);
      return reply(res, 200, { success: true });
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

  const callback = async (sub: PushSubscription, m: StoredMessage, d: Delivery): Promise<void> => {
    const headers: Record<string, string> = {
      "ce-type": "com.vercel.queue.v2beta",
      "ce-specversion": "1.0",
      "ce-id": m.id,
      "ce-source": `/topic/${sub.topic}`,
      "ce-vqsqueuename": sub.topic,
      "ce-vqsconsumergroup": sub.group,
      "ce-vqsmessageid": m.id,
      "ce-vqsregion": FAKE_REGION,
    };
    let handleId: string | undefined;
    let body: Buffer | undefined;
    if (sub.mode === "inline") {
      handleId = lease(sub.topic, sub.group, m, d, sub.visibilityTimeoutSeconds);
      Object.assign(headers, {
        "ce-vqsreceipthandle": handleId,
        "ce-vqsdeliverycount": String(d.deliveryCount),
        "ce-vqscreatedat": new Date(m.createdAt).toISOString(),
        "ce-vqsexpiresat": new Date(m.expiresAt).toISOString(),
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
      d.visibleAt = clock.now() + sub.retryAfterSeconds * 1000;
    }
  };

  return {
    url,
    clock,
    sends,
    leaseCalls,
    callbacks,
    clientOptions: () => ({
      region: FAKE_REGION,
      token: FAKE_TOKEN,
      deploymentId: null,
      resolveBaseUrl: () => new URL(url),
    }),
    inject(topic, body) {
      return store(topic, Buffer.from(body), "application/json", 0, DAY_S).id;
    },
    subscribePush(topic, route, options = {}) {
      const group = options.group ?? `app_Sapi_Squeues_S${topic}_Sroute_Dts`;
      groupOf(topic, group);
      pushes.push({
        topic,
        group,
        route,
        retryAfterSeconds: options.retryAfterSeconds ?? 60,
        visibilityTimeoutSeconds: options.visibilityTimeoutSeconds ?? 300,
        mode: options.mode ?? "inline",
      });
    },
    async dispatch(options = {}) {
      const concurrency = options.concurrency ?? 4;
      let made = 0;
      for (;;) {
        const due: [PushSubscription, StoredMessage, Delivery][] = [];
        for (const sub of pushes) for (const [m, d] of visible(sub.topic, sub.group)) due.push([sub, m, d]);
        if (due.length === 0) return made;
        let next = 0;
        const lane = async () => {
          while (next < due.length) {
            const [sub, m, d] = due[next++] as [PushSubscription, StoredMessage, Delivery];
            // Another lane's callback may have changed it (e.g. a republish made it visible later).
            if (d.acked || d.visibleAt > clock.now()) continue;
            made += 1;
            await callback(sub, m, d);
          }
        };
        await Promise.all(Array.from({ length: concurrency }, lane));
      }
    },
    pending(topic, group) {
      const now = clock.now();
      let n = 0;
      for (const [id, d] of groupOf(topic, group)) {
        const m = messages.get(id);
        if (m && !d.acked && m.expiresAt > now) n += 1;
      }
      return n;
    },
    nextVisibleAt() {
      const now = clock.now();
      let next: number | undefined;
      for (const byGroup of groups.values()) {
        for (const deliveries of byGroup.values()) {
          for (const [id, d] of deliveries) {
            const m = messages.get(id);
            if (!m || d.acked || m.expiresAt <= now) continue;
            if (next === undefined || d.visibleAt < next) next = d.visibleAt;
          }
        }
      }
      return next;
    },
    deliveryCount(topic, group, messageId) {
      return groups.get(topic)?.get(group)?.get(messageId)?.deliveryCount;
    },
    failSends(n) {
      failingSends = n;
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
}
