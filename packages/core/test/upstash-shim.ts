// A loopback stand-in for Upstash's REST endpoint in front of the local Redis
// (#20; ../shared/notes/upstash.md), so tests run the real `@upstash/redis`
// client and the real `@upstash/ratelimit` Lua scripts. It speaks what the
// client sends: POST `/` (one command), `/pipeline` and `/multi-exec` (a list
// of commands, run in order; the second inside MULTI/EXEC), JSON bodies,
// `Authorization: Bearer <token>`, and `Upstash-Encoding: base64` results —
// every string in a result is base64, recursively, except a top-level "OK".
// Upstash's `#!lua flags=allow-key-locking` script flag, which stock Redis
// rejects, is stripped, and the original script's SHA is mapped to the
// rewritten one's so EVALSHA with the library's fixed SHAs keeps hitting.
// `down(true)` answers every request 503; `hang(true)` holds every request
// unanswered (until `hang(false)` or `close()`, which answer them 503).
import { createHash, randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createClient, ErrorReply, MultiErrorReply, RESP_TYPES } from "redis";

export interface UpstashShim {
  /** `http://127.0.0.1:<port>`: the client's `url`. */
  readonly url: string;
  /** The client's `token`. */
  readonly token: string;
  /** Answer every request 503 (true) or serve again (false). */
  down(on: boolean): void;
  /** Hold every request without an answer (true), or serve again (false; held requests get 503). */
  hang(on: boolean): void;
  /** Requests served (not counting refused or held ones). */
  readonly served: number;
  /** Deletes every key matching `pattern` (e.g. `"test:abc:*"`) in the Redis behind the shim. */
  deleteKeys(pattern: string): Promise<number>;
  close(): Promise<void>;
}

const LOCKING_FLAG = "allow-key-locking";
const sha1 = (text: string) => createHash("sha1").update(text).digest("hex");

/** Removes Upstash's `allow-key-locking` from a script's `#!lua flags=…` line; null when there is none. */
function stripLockingFlag(script: string): string | null {
  const match = /^#!lua flags=([^\n]*)/.exec(script);
  if (!match?.[1]?.split(",").includes(LOCKING_FLAG)) return null;
  const rest = match[1].split(",").filter((flag) => flag !== LOCKING_FLAG);
  return `${rest.length > 0 ? `#!lua flags=${rest.join(",")}` : "#!lua"}${script.slice(match[0].length)}`;
}

type Reply = Buffer | string | number | null | Reply[];

/** Upstash's base64 mode: every string, at any depth, base64 — except a literal top-level "OK". */
function encode(value: unknown, base64: boolean, top: boolean): unknown {
  if (Buffer.isBuffer(value)) return base64 ? value.toString("base64") : value.toString("utf8");
  if (typeof value === "string") {
    if (!base64 || (top && value === "OK")) return value;
    return Buffer.from(value, "utf8").toString("base64");
  }
  if (Array.isArray(value)) return value.map((item) => encode(item, base64, false));
  if (typeof value === "bigint") return Number(value);
  return value ?? null;
}

export async function startUpstashShim(options: { redisUrl?: string } = {}): Promise<UpstashShim> {
  const token = `shim-${randomUUID()}`;
  // Bulk strings as Buffers: values are bytes, and the shim re-encodes them.
  const redis = createClient({ url: options.redisUrl ?? "redis://127.0.0.1:6379" }).withTypeMapping({
    [RESP_TYPES.BLOB_STRING]: Buffer,
  });
  redis.on("error", () => {
    // node-redis reconnects by itself; a request in flight gets the error.
  });
  await redis.connect();

  // The library's SHA (of the script with the flag) → the SHA Redis knows.
  const remappedSha = new Map<string, string>();
  let isDown = false;
  let isHanging = false;
  let served = 0;
  const held = new Set<ServerResponse>();

  /** The command as Redis gets it: names and arguments as strings, scripts rewritten. */
  function prepare(command: unknown): string[] {
    if (!Array.isArray(command) || command.length === 0) throw new Error("ERR a command is a non-empty JSON array");
    const args = command.map((part) => (typeof part === "string" ? part : JSON.stringify(part)));
    const name = args[0]?.toLowerCase();
    if (name === "eval" && args[1] !== undefined) {
      const rewritten = stripLockingFlag(args[1]);
      if (rewritten !== null) {
        remappedSha.set(sha1(args[1]), sha1(rewritten));
        args[1] = rewritten;
      }
    } else if ((name === "evalsha" || name === "evalsha_ro") && args[1] !== undefined) {
      args[1] = remappedSha.get(args[1].toLowerCase()) ?? args[1];
    } else if (name === "script" && args[1]?.toLowerCase() === "load" && args[2] !== undefined) {
      const rewritten = stripLockingFlag(args[2]);
      if (rewritten !== null) {
        remappedSha.set(sha1(args[2]), sha1(rewritten));
        args[2] = rewritten;
      }
    }
    return args;
  }

  const errorText = (error: unknown) => (error instanceof Error ? error.message : String(error));

  async function runOne(command: unknown, base64: boolean): Promise<{ result: unknown } | { error: string }> {
    try {
      const reply = await redis.sendCommand<Reply>(prepare(command));
      return { result: encode(reply, base64, true) };
    } catch (error) {
      return { error: errorText(error) };
    }
  }

  async function runPipeline(commands: unknown, base64: boolean) {
    if (!Array.isArray(commands)) throw new Error("ERR a pipeline is a JSON array of commands");
    // Sent together on one connection: Redis runs them in this order.
    return Promise.all(commands.map((command) => runOne(command, base64)));
  }

  async function runMultiExec(commands: unknown, base64: boolean) {
    if (!Array.isArray(commands)) throw new Error("ERR a transaction is a JSON array of commands");
    const prepared = commands.map(prepare);
    const multi = redis.multi();
    for (const args of prepared) multi.addCommand(args);
    try {
      const replies = (await multi.exec()) as unknown[];
      return replies.map((reply) => ({ result: encode(reply, base64, true) }));
    } catch (error) {
      if (error instanceof MultiErrorReply) {
        return error.replies.map((reply) =>
          reply instanceof ErrorReply ? { error: reply.message } : { result: encode(reply, base64, true) },
        );
      }
      throw error;
    }
  }

  const send = (res: ServerResponse, status: number, body: unknown) => {
    if (res.writableEnded || res.destroyed) return;
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    if (isHanging) {
      held.add(res);
      res.on("close", () => held.delete(res));
      return;
    }
    if (isDown) return send(res, 503, { error: "Service Unavailable (shim is down)" });
    if (req.method !== "POST") return send(res, 405, { error: "ERR only POST" });
    if (req.headers.authorization !== `Bearer ${token}`) return send(res, 401, { error: "Unauthorized" });
    const base64 = String(req.headers["upstash-encoding"] ?? "").toLowerCase() === "base64";
    let body: unknown;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      return send(res, 400, { error: "ERR the body is not JSON" });
    }
    const path = new URL(req.url ?? "/", "http://shim").pathname.replace(/\/+$/, "");
    try {
      if (path === "") {
        const answer = await runOne(body, base64);
        served += 1;
        return send(res, "error" in answer ? 400 : 200, answer);
      }
      if (path === "/pipeline") {
        const answers = await runPipeline(body, base64);
        served += 1;
        return send(res, 200, answers);
      }
      if (path === "/multi-exec") {
        const answers = await runMultiExec(body, base64);
        served += 1;
        return send(res, 200, answers);
      }
      return send(res, 404, { error: `ERR no such endpoint ${path}` });
    } catch (error) {
      return send(res, 400, { error: errorText(error) });
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((error) => send(res, 500, { error: errorText(error) }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;

  const releaseHeld = () => {
    for (const res of held) send(res, 503, { error: "Service Unavailable (shim was hanging)" });
    held.clear();
  };

  return {
    url: `http://127.0.0.1:${port}`,
    token,
    down(on) {
      isDown = on;
    },
    hang(on) {
      isHanging = on;
      if (!on) releaseHeld();
    },
    get served() {
      return served;
    },
    async deleteKeys(pattern) {
      let deleted = 0;
      for await (const keys of redis.scanIterator({ MATCH: pattern, COUNT: 500 })) {
        if (keys.length > 0) deleted += await redis.del(keys);
      }
      return deleted;
    },
    async close() {
      releaseHeld();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await redis.close();
    },
  };
}
