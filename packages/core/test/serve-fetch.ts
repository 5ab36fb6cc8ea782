import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";

export interface ServedFetch {
  readonly url: string;
  /** Bytes of request bodies the handler has pulled so far (what it read, not what the socket buffered). */
  bodyBytesRead(): number;
  close(): Promise<void>;
}

/**
 * Serves a Fetch-API handler on 127.0.0.1 over real HTTP, as a Node host
 * (Next.js, a Fetch server) would: the request body is a stream the handler
 * pulls one chunk at a time, and when the handler answers without reading
 * the whole body the connection is closed instead of draining the rest.
 */
export async function serveFetch(handler: (request: Request) => Promise<Response>): Promise<ServedFetch> {
  let read = 0;
  const server = createServer(async (req, res) => {
    const url = `http://${req.headers.host ?? "127.0.0.1"}${req.url ?? "/"}`;
    const headers = new Headers();
    for (const [key, value] of Object.entries(req.headers)) {
      if (value !== undefined) headers.set(key, Array.isArray(value) ? value.join(", ") : value);
    }
    const hasBody = req.method !== "GET" && req.method !== "HEAD";
    const response = await handler(
      new Request(url, {
        method: req.method ?? "GET",
        headers,
        ...(hasBody ? { body: pulled(req, (n) => (read += n)), duplex: "half" } : {}),
      } as RequestInit),
    );
    const unread = !req.complete;
    res.statusCode = response.status;
    for (const [key, value] of response.headers) res.setHeader(key, value);
    if (unread) res.setHeader("connection", "close");
    res.end(Buffer.from(await response.arrayBuffer()), () => {
      // Never drain an unread body: the host stops reading once the handler answered.
      if (unread) req.socket.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    bodyBytesRead: () => read,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The request body as a stream that reads from the socket only when the handler pulls. */
function pulled(req: IncomingMessage, count: (bytes: number) => void): ReadableStream<Uint8Array> {
  const chunks = req[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        const { done, value } = await chunks.next();
        if (done) {
          controller.close();
          return;
        }
        count(value.byteLength);
        controller.enqueue(new Uint8Array(value));
      },
      // Cancelling only stops pulling; ending the iterator would destroy the
      // socket before the handler's answer is written.
      cancel() {},
    },
    { highWaterMark: 0 },
  );
}
