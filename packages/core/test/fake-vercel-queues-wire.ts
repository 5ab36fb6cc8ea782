/**
 * How the fake Vercel Queues server writes its answers and reads headers on
 * the wire (`fake-vercel-queues.ts`): a receive's multipart body, a JSON or
 * empty reply, an injected fault's answer, an integer header.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { FakeReply } from "./fake-vercel-queues-api.ts";
import type { Delivery, StoredMessage } from "./fake-vercel-queues-state.ts";

export const multipart = (res: ServerResponse, parts: [StoredMessage, Delivery][]) => {
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

export const reply = (res: ServerResponse, status: number, body?: unknown, headers: Record<string, string> = {}) => {
  if (body === undefined) {
    res.writeHead(status, headers);
    res.end();
    return;
  }
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
};

export const replyFault = (res: ServerResponse, fault: FakeReply) =>
  // A 2xx fault (an ack or PATCH answered as done but not applied) looks like the real answer.
  fault.status === 204
    ? reply(res, 204)
    : reply(res, fault.status, fault.status < 300 ? { success: true } : `injected ${fault.status}`, {
        ...(fault.retryAfter !== undefined ? { "retry-after": String(fault.retryAfter) } : {}),
        ...(fault.errorCode !== undefined ? { "vqs-error-code": fault.errorCode } : {}),
      });

export const intHeader = (req: IncomingMessage, name: string): number | undefined | "bad" => {
  const raw = req.headers[name.toLowerCase()];
  if (raw === undefined) return undefined;
  const n = Number(raw);
  return Number.isInteger(n) ? n : "bad";
};
