// The chaos run's hostile broker: an HTTP proxy in front of the fake Vercel
// Queues server (test/fake-vercel-queues.ts), so the broker's faults need no
// change to the fake. It forwards every request, except that it
// - drops a share of acknowledgements: the worker is told 204, the server
//   never hears of it, and the message comes back when its lease ends;
// - redelivers early: right after handing out a message, it sets that lease's
//   visibility to 0 (a PATCH of its own), so another worker may receive the
//   message while the first still runs it; the first one's ack then finds its
//   lease lost.
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
}

/** What the broker did with one lease, for the forensics of a failed run. */
export interface BrokerEvent {
  readonly at: number;
  readonly type: "received" | "ack-dropped" | "ack-forwarded" | "early-redelivery" | "visibility";
  readonly messageId: string | undefined;
  readonly deliveryCount?: number;
  readonly status?: number;
}

export interface HostileBroker {
  readonly url: string;
  /** Every lease event, in order (messageId from the receive that handed out the lease). */
  readonly events: readonly BrokerEvent[];
  readonly stats: { acksDropped: number; earlyRedeliveries: number; forwarded: number };
  /** Off: forwards everything untouched (the end of the run drains in peace). */
  setHostile(on: boolean): void;
  close(): Promise<void>;
}

const PART_HEADERS = /Vqs-Message-Id: ([^\r\n]+)\r\nVqs-Delivery-Count: (\d+)[\s\S]*?Vqs-Receipt-Handle: ([^\r\n]+)/gi;

export async function startHostileBroker(options: HostileBrokerOptions): Promise<HostileBroker> {
  const dropAckRate = options.dropAckRate ?? 0.05;
  const earlyRate = options.earlyRedeliveryRate ?? 0.03;
  const stats = { acksDropped: 0, earlyRedeliveries: 0, forwarded: 0 };
  let hostile = true;
  const timers = new Set<NodeJS.Timeout>();
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

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const path = req.url ?? "/";
    const method = req.method ?? "GET";
    const parts = path.split("?")[0]?.split("/") ?? [];
    // ["", "api", "v3", "topic", topic, "consumer", group, "lease", handle]
    const isAck = method === "DELETE" && parts[7] === "lease";
    const isReceive = method === "POST" && parts[5] === "consumer" && parts.length === 7;
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
        event("received", handleId, { deliveryCount: Number(match[2]) });
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
