/**
 * A fake Resend API on 127.0.0.1 for tests and the bench: `POST /emails` and
 * `POST /emails/batch` as the real SDK sends them (Bearer key, JSON body,
 * `Idempotency-Key`, `x-batch-validation`), answering as Resend does:
 * `{ id }` / `{ data: [{ id }…] }`, or `{ statusCode, name, message }`, with
 * the ratelimit-* headers on every answer and Retry-After on a 429.
 *
 * Idempotency as Resend documents it: a success is remembered under its key
 * (per endpoint) and the same key with the same body gets the same answer
 * again without sending anything; the same key with another body is 409
 * `invalid_idempotent_request`; a key whose first request is still being
 * handled is 409 `concurrent_idempotent_requests`; a failure is not
 * remembered. Every request is recorded, every accepted e-mail too.
 *
 * Faults on demand: 429 for the next N requests or a seeded fraction of
 * them, any other error for the next N, and `beforeAccept`, run (awaited)
 * while a request is being handled — the window in which a test changes the
 * world under a send in flight.
 */
import { createHash, randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import {
  checkBatch,
  checkEmail,
  isWireError,
  seededRandom,
  type WireEmail,
  type WireError,
  wireError,
} from "./fake-resend-wire.ts";

export type FakeOutcome = "accepted" | "replayed" | "rate_limited" | "rejected";
export type FakeEndpoint = "/emails" | "/emails/batch";

export interface FakeRequest {
  readonly seq: number;
  readonly method: string;
  readonly path: string;
  readonly idempotencyKey: string | undefined;
  readonly authorization: string | undefined;
  readonly userAgent: string | undefined;
  readonly batchValidation: string | undefined;
  readonly body: unknown;
  status: number;
  outcome: FakeOutcome;
  error?: string;
}

export interface FakeEmail {
  readonly id: string;
  readonly endpoint: FakeEndpoint;
  readonly requestSeq: number;
  readonly idempotencyKey: string | undefined;
  readonly to: readonly string[];
  readonly from: string;
  readonly subject: string;
  readonly tags: readonly { name: string; value: string }[];
}

export interface FakeResend {
  /** The base URL to give the SDK (RESEND_BASE_URL). */
  readonly url: string;
  readonly apiKey: string;
  readonly requests: readonly FakeRequest[];
  readonly emails: readonly FakeEmail[];
  /** Requests on `path` (either endpoint when omitted) that ended with `outcome`. */
  count(outcome: FakeOutcome, path?: FakeEndpoint): number;
  /** E-mails accepted per recipient address. */
  emailsPerRecipient(): Map<string, number>;
  /** The next `n` requests get 429 rate_limit_exceeded with `Retry-After: retryAfterSeconds`. */
  rateLimitNext(n: number, retryAfterSeconds?: number): void;
  /** From now on, each request gets a 429 with probability `fraction` (seeded: the same storm every run); 0 stops it. */
  rateLimitFraction(fraction: number, options?: { seed?: number; retryAfterSeconds?: number }): void;
  /** The next `n` requests that would be accepted get this error instead (a 500, a 422 …); nothing is sent. */
  failNext(n: number, error: WireError): void;
  /** Awaited while each request that would be accepted is in flight, before it is. */
  beforeAccept(hook: ((request: FakeRequest) => Promise<void>) | undefined): void;
  close(): Promise<void>;
}

interface Remembered {
  readonly fingerprint: string;
  /** Undefined while the first request under the key is in flight. */
  answer?: { readonly status: number; readonly body: unknown };
}

const RATE_LIMIT = 10;

export async function startFakeResend(options: { apiKey?: string } = {}): Promise<FakeResend> {
  const apiKey = options.apiKey ?? "re_test_fake";
  const requests: FakeRequest[] = [];
  const emails: FakeEmail[] = [];
  const keys = new Map<string, Remembered>();
  let limitNext = 0;
  let limitNextRetryAfter = 1;
  let storm: { fraction: number; random: () => number; retryAfter: number } | undefined;
  const failures: WireError[] = [];
  let hook: ((request: FakeRequest) => Promise<void>) | undefined;

  const send = (res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}) => {
    res.writeHead(status, {
      "content-type": "application/json",
      "ratelimit-limit": String(RATE_LIMIT),
      "ratelimit-remaining": status === 429 ? "0" : String(RATE_LIMIT - 1),
      "ratelimit-reset": "1",
      ...extra,
    });
    res.end(JSON.stringify(body));
  };
  const answer = (
    res: ServerResponse,
    request: FakeRequest,
    outcome: FakeOutcome,
    status: number,
    body: unknown,
    headers: Record<string, string> = {},
  ) => {
    request.status = status;
    request.outcome = outcome;
    if (isWireError(body)) request.error = `${body.name}: ${body.message}`;
    send(res, status, body, headers);
  };
  /** Whether this request is rate limited, and the Retry-After (seconds) it is told. */
  const rateLimited = (): number | undefined => {
    if (limitNext > 0) {
      limitNext -= 1;
      return limitNextRetryAfter;
    }
    return storm !== undefined && storm.random() < storm.fraction ? storm.retryAfter : undefined;
  };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    const path = (req.url ?? "").split("?")[0] as string;
    const key = header(req, "idempotency-key");
    let body: unknown;
    try {
      body = raw === "" ? undefined : JSON.parse(raw);
    } catch {
      body = raw;
    }
    const request: FakeRequest = {
      seq: requests.length + 1,
      method: req.method ?? "",
      path,
      idempotencyKey: key,
      authorization: header(req, "authorization"),
      userAgent: header(req, "user-agent"),
      batchValidation: header(req, "x-batch-validation"),
      body,
      status: 0,
      outcome: "rejected",
    };
    requests.push(request);
    const reject = (error: WireError) => answer(res, request, "rejected", error.statusCode, error);

    if (req.method !== "POST" || (path !== "/emails" && path !== "/emails/batch")) {
      return reject(wireError(req.method === "POST" ? 404 : 405, "not_found", `No route for ${req.method} ${path}.`));
    }
    const endpoint = path as FakeEndpoint;
    if (!request.authorization?.startsWith("Bearer ")) {
      return reject(wireError(401, "missing_api_key", "Missing API key in the authorization header."));
    }
    if (request.authorization !== `Bearer ${apiKey}`)
      return reject(wireError(403, "invalid_api_key", "API key is invalid."));
    // The rate limit is checked before anything else the API does with a request.
    const retryAfter = rateLimited();
    if (retryAfter !== undefined) {
      const tooMany = wireError(
        429,
        "rate_limit_exceeded",
        "Too many requests. You can only make 10 requests per second.",
      );
      return answer(res, request, "rate_limited", 429, tooMany, { "retry-after": String(retryAfter) });
    }
    if (!header(req, "content-type")?.startsWith("application/json") || typeof raw !== "string" || body === raw) {
      return reject(wireError(400, "validation_error", "The request body must be JSON."));
    }
    if (key !== undefined && (key.length < 1 || key.length > 256)) {
      return reject(wireError(400, "invalid_idempotency_key", "The key must be between 1-256 chars."));
    }
    const checked = endpoint === "/emails" ? checkEmail(body, "", false) : checkBatch(body);
    if (isWireError(checked)) return reject(checked);

    const slot = key === undefined ? undefined : `${endpoint} ${key}`;
    const fingerprint = createHash("sha256").update(raw).digest("hex");
    if (slot !== undefined) {
      const seen = keys.get(slot);
      if (seen !== undefined && seen.fingerprint !== fingerprint) {
        return reject(
          wireError(
            409,
            "invalid_idempotent_request",
            "Same idempotency key used with a different request payload. Change your idempotency key or payload.",
          ),
        );
      }
      if (seen?.answer === undefined && seen !== undefined) {
        return reject(
          wireError(
            409,
            "concurrent_idempotent_requests",
            "Same idempotency key used while original request is still in progress. Try the request again later.",
          ),
        );
      }
      if (seen?.answer !== undefined) return answer(res, request, "replayed", seen.answer.status, seen.answer.body);
      keys.set(slot, { fingerprint });
    }
    try {
      if (hook !== undefined) await hook(request);
      const failure = failures.shift();
      if (failure !== undefined) {
        if (slot !== undefined) keys.delete(slot);
        return reject(failure);
      }
      const list = Array.isArray(checked) ? checked : [checked as WireEmail];
      const ids = list.map((email) => {
        const id = randomUUID();
        emails.push({
          id,
          endpoint,
          requestSeq: request.seq,
          idempotencyKey: key,
          to: email.to,
          from: email.from,
          subject: email.subject,
          tags: email.tags ?? [],
        });
        return { id };
      });
      const result = endpoint === "/emails" ? { id: ids[0]?.id } : { data: ids };
      if (slot !== undefined) keys.set(slot, { fingerprint, answer: { status: 200, body: result } });
      answer(res, request, "accepted", 200, result);
    } catch (error) {
      if (slot !== undefined) keys.delete(slot);
      throw error;
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) send(res, 500, wireError(500, "internal_server_error", String(error)));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}`,
    apiKey,
    requests,
    emails,
    count: (outcome, path) =>
      requests.filter((r) => r.outcome === outcome && (path === undefined || r.path === path)).length,
    emailsPerRecipient() {
      const per = new Map<string, number>();
      for (const email of emails) for (const to of email.to) per.set(to, (per.get(to) ?? 0) + 1);
      return per;
    },
    rateLimitNext(n, retryAfterSeconds = 1) {
      limitNext = n;
      limitNextRetryAfter = retryAfterSeconds;
    },
    rateLimitFraction(fraction, stormOptions = {}) {
      storm =
        fraction > 0
          ? { fraction, random: seededRandom(stormOptions.seed ?? 20), retryAfter: stormOptions.retryAfterSeconds ?? 1 }
          : undefined;
    },
    failNext(n, error) {
      for (let i = 0; i < n; i++) failures.push(error);
    },
    beforeAccept(next) {
      hook = next;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}
