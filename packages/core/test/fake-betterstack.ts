// A BetterStack (Logtail) ingest endpoint on loopback, for tests of the real
// @logtail/node client: it gunzips and msgpack-decodes what the SDK sends.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { gunzipSync } from "node:zlib";
import { decode } from "@msgpack/msgpack";

/** A BetterStack ingest endpoint on loopback: gunzips and msgpack-decodes what the real SDK sends. */
export class FakeIngest {
  readonly logs: Record<string, unknown>[] = [];
  readonly requests: { authorization?: string; contentType?: string; contentEncoding?: string }[] = [];
  status = 202;
  #server: Server = createServer((req, res) => this.#handle(req, res));
  async start() {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }
  async stop() {
    this.#server.closeAllConnections();
    await new Promise((resolve) => this.#server.close(resolve));
  }
  #handle(req: IncomingMessage, res: ServerResponse) {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      this.requests.push({
        ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}),
        ...(req.headers["content-type"] ? { contentType: req.headers["content-type"] } : {}),
        ...(req.headers["content-encoding"] ? { contentEncoding: String(req.headers["content-encoding"]) } : {}),
      });
      if (this.status < 300) {
        const body = Buffer.concat(chunks);
        const raw = req.headers["content-encoding"] === "gzip" ? gunzipSync(body) : body;
        this.logs.push(...(decode(raw) as Record<string, unknown>[]));
      }
      res.statusCode = this.status;
      res.end();
    });
  }
}
