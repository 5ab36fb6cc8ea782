// The chaos run's hostile broker: an HTTP proxy in front of the fake Vercel
// Queues server (test/fake-vercel-queues.ts), so the broker's faults need no
// change to the fake. It forwards every request, except that it
// - drops a share of acknowledgements: the worker is told 204, the server
//   never hears of it, and the message comes back when its lease ends;
// - redelivers early: right after handing out a message, it sets that lease's
//   visibility to 0 (a PATCH of its own), so another worker may receive the
//   message while the first still runs it; the first one's ack then finds its
//   lease lost;
// - knows which worker received each lease: a worker may name itself in the
//   path it is given (`/w/<name>/api/v3/...`), which the broker strips;
// - answers a share of the sends (POST /api/v3/topic/{topic}: the producer's
//   publishes, the adapter's republishes — deferrals, hops, rescues — and the
//   operator's replays) 202 `{"status":"accepted"}` with no message id, as the
//   service does for "accepted for deferred processing" (the SDK reads
//   `messageId: null`, the adapter `stored: false`): "stored later" sends are
//   forwarded after a random delay (the copy arrives after the 202), "never
//   stored" ones are never forwarded;
// - answers a few sends 5xx, which the SDK throws on: 503 never forwarded
//   (nothing stored), 500 forwarded first (stored, but the answer was lost).
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Random } from "./random.ts";

export interface HostileBrokerOptions {
  /** The fake server's base URL. */
  readonly upstream: string;
  readonly token: string;
  readonly random: Random;
  /** Share of acknowledgements (DELETE of a lease) answered 204 and never forwarded. @default 0.05 */
  readonly dropAckRate?: number;
  /** Share of received messages made visible again at once. @default 0.03 */
  readonly earlyRedeliveryRate?: number;
  /** Share of sends answered 202 with no message id, and forwarded upstream after a delay (stored later). @default 0.04 */
  readonly storedLaterRate?: number;
  /** Share of sends answered 202 with no message id, and never forwarded (never stored). @default 0.04 */
  readonly neverStoredRate?: number;
  /** Share of sends answered 5xx: half 503 never forwarded, half 500 forwarded first (stored, answer lost). @default 0.02 */
  readonly sendErrorRate?: number;
  /** Longest wait before a "stored later" send reaches the server, in ms (a random wait up to it). @default 2000 */
  readonly storeLaterMaxMs?: number;
  /** The consumers' replay topics (`toVercelReplayTopic`): a send there is an operator's replay. */
  readonly replayTopics?: readonly string[];
}

/**
 * Whose send it was: the adapter's own republish (a deferral, a hop, a rescue:
 * its idempotency key starts `softcrum-deferral:`), an operator's replay (on a
 * consumer's replay topic), or anything else (a producer's publish).
 */
export type SendKind = "publish" | "republish" | "replay";

/** What the broker did with one lease, or with one send it did not simply forward, for the forensics of a failed run. */
export interface BrokerEvent {
  readonly at: number;
  readonly type:
    | "received"
    | "ack-dropped"
    | "ack-forwarded"
    | "early-redelivery"
    | "visibility"
    | "send-stored-later"
    | "send-never-stored"
    | "send-error";
  readonly messageId: string | undefined;
  readonly deliveryCount?: number;
  readonly status?: number;
  /** Sends: the job_id the body carries (none for a foreign payload). */
  readonly jobId?: string;
  readonly sendKind?: SendKind;
  /** `send-error`: whether the send was forwarded (stored) before the error was answered. */
  readonly stored?: boolean;
  /** `received`: the worker that received the lease, when it named itself (`/w/<name>/...`). */
  readonly client?: string;
}

/** The send faults of one kind of send. */
export interface SendFaultCounts {
  sends: number;
  storedLater: number;
  neverStored: number;
  errors: number;
}

export interface BrokerStats {
  acksDropped: number;
  earlyRedeliveries: number;
  forwarded: number;
  /** Sends answered 202 and forwarded later / never; sends answered 5xx. */
  storedLater: number;
  neverStored: number;
  sendErrors: number;
  /** The same, by kind of send. */
  sends: Record<SendKind, SendFaultCounts>;
  /** The rates in force. */
  rates: {
    dropAck: number;
    earlyRedelivery: number;
    storedLater: number;
    neverStored: number;
    sendError: number;
    storeLaterMaxMs: number;
  };
}

export interface HostileBroker {
  readonly url: string;
  /** Every lease event, in order (messageId from the receive that handed out the lease), and every send fault. */
  readonly events: readonly BrokerEvent[];
  readonly stats: BrokerStats;
  /** "Stored later" sends not forwarded yet: the queue has not drained while there are any. */
  pendingSends(): number;
  /** Off: forwards everything untouched (the end of the run drains in peace). */
  setHostile(on: boolean): void;
  close(): Promise<void>;
}

const PART_HEADERS = /Vqs-Message-Id: ([^\r\n]+)\r\nVqs-Delivery-Count: (\d+)[\s\S]*?Vqs-Receipt-Handle: ([^\r\n]+)/gi;
/** A job_id in a send's body: an envelope's JSON, bare or after a wrapper's header line. */
const JOB_ID = /"job_id":"([0-9a-fA-F-]{36})"/;

/** The job_id a message body carries, if any (an envelope, a wrapper around one, a replayed letter). */
export function jobIdIn(body: Buffer): string | undefined {
  return JOB_ID.exec(body.toString("latin1"))?.[1];
}

export async function startHostileBroker(options: HostileBrokerOptions): Promise<HostileBroker> {
  const dropAckRate = options.dropAckRate ?? 0.05;
  const earlyRate = options.earlyRedeliveryRate ?? 0.03;
  const storedLaterRate = options.storedLaterRate ?? 0.04;
  const neverStoredRate = options.neverStoredRate ?? 0.04;
  const sendErrorRate = options.sendErrorRate ?? 0.02;
  const storeLaterMaxMs = options.storeLaterMaxMs ?? 2_000;
  const replayTopics = new Set(options.replayTopics ?? []);
  const kindCounts = (): SendFaultCounts => ({ sends: 0, storedLater: 0, neverStored: 0, errors: 0 });
  const stats: BrokerStats = {
    acksDropped: 0,
    earlyRedeliveries: 0,
    forwarded: 0,
    storedLater: 0,
    neverStored: 0,
    sendErrors: 0,
    sends: { publish: kindCounts(), republish: kindCounts(), replay: kindCounts() },
    rates: {
      dropAck: dropAckRate,
      earlyRedelivery: earlyRate,
      storedLater: storedLaterRate,
      neverStored: neverStoredRate,
      sendError: sendErrorRate,
      storeLaterMaxMs,
    },
  };
  let hostile = true;
  const timers = new Set<NodeJS.Timeout>();
  /** Stored-later sends whose forward has not been answered yet. */
  let laterInFlight = 0;
  const events: BrokerEvent[] = [];
  const messageOf = new Map<string, string>();
  const event = (type: BrokerEvent["type"], handleId: string | undefined, extra: Partial<BrokerEvent> = {}) =>
    events.push({ at: Date.now(), type, messageId: handleId ? messageOf.get(handleId) : undefined, ...extra });

  const forward = async (method: string, path: string, headers: Headers, body: Buffer | undefined) =>
    fetch(`${options.upstream}${path}`, {
      method,
      headers,
      ...(body && body.length > 0 ? { body: new Uint8Array(body) } : {}),
    });

  /**
   * The service's answer to a send "accepted for deferred processing": 202
   * `{"status":"accepted"}`, no message id (as the fake server answers its own
   * 202 fault); @vercel/queue 0.6.0 reads any 202 as `{ messageId: null }`.
   */
  const acceptedReply = (res: ServerResponse) => {
    res.writeHead(202, { "content-type": "application/json" });
    res.end(JSON.stringify({ status: "accepted" }));
  };

  /** Forwards a send whose 202 the worker already has, after a random wait; its answer goes nowhere. */
  const forwardLater = (path: string, headers: Headers, body: Buffer) => {
    laterInFlight += 1;
    const timer = setTimeout(
      () => {
        timers.delete(timer);
        forward("POST", path, headers, body)
          .then(
            (r) => r.arrayBuffer(),
            () => {},
          )
          .finally(() => {
            laterInFlight -= 1;
          });
      },
      options.random.int(0, storeLaterMaxMs),
    );
    timers.add(timer);
  };

  /**
   * A send's fault, if it meets one: answered here (and forwarded, or not),
   * true; false when the send goes upstream as it is.
   */
  const sendFault = async (
    res: ServerResponse,
    path: string,
    topic: string,
    headers: Headers,
    body: Buffer,
  ): Promise<boolean> => {
    const kind: SendKind = headers.get("vqs-idempotency-key")?.startsWith("softcrum-deferral:")
      ? "republish"
      : replayTopics.has(topic)
        ? "replay"
        : "publish";
    const counts = stats.sends[kind];
    counts.sends += 1;
    if (!hostile) return false;
    const r = options.random.next();
    const extra = { jobId: jobIdIn(body), sendKind: kind };
    if (r < storedLaterRate) {
      stats.storedLater += 1;
      counts.storedLater += 1;
      event("send-stored-later", undefined, { ...extra, status: 202 });
      forwardLater(path, headers, body);
      acceptedReply(res);
      return true;
    }
    if (r < storedLaterRate + neverStoredRate) {
      stats.neverStored += 1;
      counts.neverStored += 1;
      event("send-never-stored", undefined, { ...extra, status: 202 });
      acceptedReply(res);
      return true;
    }
    if (r < storedLaterRate + neverStoredRate + sendErrorRate) {
      stats.sendErrors += 1;
      counts.errors += 1;
      // 500 (InternalServerError in the SDK): the service stored it and the answer was lost.
      // 503 (the SDK's ConsumerRegistryNotConfiguredError for a send): nothing stored.
      const stored = options.random.chance(0.5);
      if (stored) {
        const upstream = await forward("POST", path, headers, body);
        await upstream.arrayBuffer();
        stats.forwarded += 1;
      }
      const status = stored ? 500 : 503;
      event("send-error", undefined, { ...extra, status, stored });
      res.writeHead(status, { "content-type": "text/plain" });
      res.end(`hostile broker: injected ${status}`);
      return true;
    }
    return false;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    // A worker that names itself: `/w/<name>/api/v3/...`.
    const named = /^\/w\/([^/]+)(\/.*)$/.exec(req.url ?? "/");
    const client = named ? decodeURIComponent(named[1] ?? "") : undefined;
    const path = named ? (named[2] ?? "/") : (req.url ?? "/");
    const method = req.method ?? "GET";
    const parts = path.split("?")[0]?.split("/") ?? [];
    // ["", "api", "v3", "topic", topic, "consumer", group, "lease", handle]
    const isAck = method === "DELETE" && parts[7] === "lease";
    const isReceive = method === "POST" && parts[5] === "consumer" && parts.length === 7;
    const isSend = method === "POST" && parts[3] === "topic" && parts.length === 5;
    const leaseHandle = parts[7] === "lease" ? decodeURIComponent(parts[8] ?? "") : undefined;
    if (hostile && isAck && options.random.chance(dropAckRate)) {
      stats.acksDropped += 1;
      event("ack-dropped", leaseHandle);
      res.writeHead(204);
      res.end();
      return;
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (value === undefined || name === "host" || name === "content-length" || name === "connection") continue;
      headers.set(name, Array.isArray(value) ? value.join(", ") : value);
    }
    if (isSend && (await sendFault(res, path, decodeURIComponent(parts[4] ?? ""), headers, body))) return;
    const upstream = await forward(method, path, headers, body);
    const answer = Buffer.from(await upstream.arrayBuffer());
    stats.forwarded += 1;
    const out: Record<string, string> = {};
    const contentType = upstream.headers.get("content-type");
    if (contentType) out["content-type"] = contentType;
    res.writeHead(upstream.status, out);
    res.end(answer);
    if (isAck) event("ack-forwarded", leaseHandle, { status: upstream.status });
    else if (leaseHandle !== undefined) event("visibility", leaseHandle, { status: upstream.status });

    if (isReceive && upstream.status === 200) {
      for (const match of answer.toString("latin1").matchAll(PART_HEADERS)) {
        const handleId = match[3]?.trim();
        if (!handleId) continue;
        messageOf.set(handleId, match[1]?.trim() ?? "?");
        event("received", handleId, { deliveryCount: Number(match[2]), ...(client ? { client } : {}) });
        if (!hostile || !options.random.chance(earlyRate)) continue;
        const leasePath = `${parts.slice(0, 7).join("/")}/lease/${encodeURIComponent(handleId)}`;
        const timer = setTimeout(
          () => {
            timers.delete(timer);
            stats.earlyRedeliveries += 1;
            event("early-redelivery", handleId);
            const patch = new Headers({
              authorization: `Bearer ${options.token}`,
              "content-type": "application/json",
            });
            forward("PATCH", leasePath, patch, Buffer.from(JSON.stringify({ visibilityTimeoutSeconds: 0 }))).then(
              (r) => r.arrayBuffer(),
              () => {},
            );
          },
          options.random.int(20, 300),
        );
        timers.add(timer);
      }
    }
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) {
        res.writeHead(502, { "content-type": "text/plain" });
        res.end(`hostile broker: upstream failed: ${String(error)}`);
      } else res.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    stats,
    events,
    pendingSends: () => laterInFlight,
    setHostile(on) {
      hostile = on;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const timer of timers) clearTimeout(timer);
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
