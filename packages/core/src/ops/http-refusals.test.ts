import { request as httpRequest } from "node:http";
import { Readable } from "node:stream";
import { useTestDatabase } from "@softcrum/testing";
import { SignJWT } from "jose";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { type ServedFetch, serveFetch } from "../../test/serve-fetch.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { createManualClock } from "../clock.ts";
import { createEnvelope } from "../envelope.ts";
import { createOps, createOpsHandler, jwtAuthorizer, MAX_BODY_BYTES, type Ops } from "./index.ts";
import { MAX_SOURCES_PER_MINUTE, OTHER_SOURCES } from "./refusals.ts";

const pg = useTestDatabase("ops-http-refusals");
const SECRET = "a-test-secret-that-is-at-least-32-bytes-long";
// A fixed minute: the coalescing counts per source and minute must not split at a minute boundary mid-test.
const clock = createManualClock(Date.UTC(2026, 10, 30, 10, 0, 20));
const errors: string[] = [];
let ops: Ops;
let server: ServedFetch;

beforeAll(async () => {
  const queue = createMemoryQueue();
  ops = createOps({ db: pg.db, queue, clock, batchPolicy: { approvalThreshold: 1 } });
  server = await serveFetch(
    createOpsHandler({
      ops,
      authorize: jwtAuthorizer({ secret: SECRET }),
      basePath: "/ops",
      logger: { warn: () => {}, error: (message) => errors.push(message) },
    }),
  );
});
afterAll(async () => {
  await server?.close();
});
beforeEach(async () => {
  await pg.sql`truncate core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  errors.length = 0;
});

const token = (sub: string, claims: Record<string, unknown> = { roles: ["ops:operator"] }) =>
  new SignJWT({ sub, ...claims })
    .setProtectedHeader({ alg: "HS256" })
    .setIssuedAt()
    .setExpirationTime("5m")
    .sign(new TextEncoder().encode(SECRET));

async function call(
  method: string,
  path: string,
  options: { token?: string; body?: unknown; rawBody?: string; headers?: Record<string, string> } = {},
) {
  const headers: Record<string, string> = { "content-type": "application/json", ...options.headers };
  if (options.token) headers["authorization"] = `Bearer ${options.token}`;
  const body = options.rawBody ?? (options.body !== undefined ? JSON.stringify(options.body) : undefined);
  const response = await fetch(`${server.url}/ops${path}`, {
    method,
    headers,
    ...(body !== undefined ? { body } : {}),
  });
  const text = await response.text();
  return { status: response.status, body: JSON.parse(text) as { error?: { code: string; message: string } } };
}

async function pendingLetters(n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const envelope = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { i } });
    const [row] = await pg.sql<{ id: string }[]>`
      insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (gen_random_uuid(), ${envelope.job_id}, 'q', 'c', ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')
      returning id`;
    ids.push(row?.id as string);
  }
  return ids;
}

const auditRows = () =>
  pg.sql<{ operator: string; action: string; result: string; scope: Record<string, unknown>; detail: string }[]>`
    select operator, action, result, scope, detail from core.ops_audit order by id`;

const UNKNOWN = "0190b3c4-0000-7000-8000-000000000000";

describe("every refused mutating HTTP call leaves exactly one audit row (#10 item 5)", () => {
  test("each refusal, enumerated over real HTTP, is audited once under the token's operator", async () => {
    const [letter] = await pendingLetters(2);
    const ana = await token("ana");
    const approverAna = await token("ana", { roles: ["ops:operator", "ops:approver"] });
    const bo = await token("bo");
    const created = await call("POST", "/batches", { token: ana, body: { reason: "fixed", ratePerSecond: 10 } });
    expect(created).toMatchObject({ status: 201, body: { status: "awaiting_approval" } });
    const batchId = (created.body as { id: string }).id;
    const ready = await call("POST", "/batches", {
      token: ana,
      body: { reason: "one", ratePerSecond: 10, limit: 1 },
    });
    const readyId = (ready.body as { id: string }).id;

    const refusals: [string, string, string, { token?: string; body?: unknown; rawBody?: string }, number, string][] = [
      ["bad JSON", "POST", "/dead-letters/discard", { token: ana, rawBody: "{not json" }, 400, "dead_letter.discard"],
      [
        "missing reason",
        "POST",
        "/dead-letters/discard",
        { token: ana, body: { ids: [letter] } },
        400,
        "dead_letter.discard",
      ],
      [
        "blank reason (a tab)",
        "POST",
        "/dead-letters/replay",
        { token: ana, body: { ids: [letter], reason: "\t" } },
        400,
        "dead_letter.replay",
      ],
      [
        "`operator` in the body",
        "POST",
        "/dead-letters/replay",
        { token: ana, body: { ids: [letter], reason: "r", operator: "bo" } },
        400,
        "dead_letter.replay",
      ],
      [
        "ids that are not UUIDs",
        "POST",
        "/dead-letters/discard",
        { token: ana, body: { ids: ["x"], reason: "r" } },
        400,
        "dead_letter.discard",
      ],
      [
        "a NUL byte in the reason",
        "POST",
        "/dead-letters/discard",
        { token: ana, body: { ids: [letter], reason: "a\u0000b" } },
        400,
        "dead_letter.discard",
      ],
      [
        "more ids than a direct replay takes",
        "POST",
        "/dead-letters/replay",
        {
          token: ana,
          body: {
            ids: Array.from({ length: 101 }, (_, i) => `0190b3c4-0000-7000-8000-${String(i).padStart(12, "0")}`),
            reason: "r",
          },
        },
        400,
        "dead_letter.replay",
      ],
      [
        "`operator` in a batch",
        "POST",
        "/batches",
        { token: ana, body: { reason: "x", ratePerSecond: 5, operator: "bo" } },
        400,
        "batch.create",
      ],
      ["a batch without a rate", "POST", "/batches", { token: ana, body: { reason: "x" } }, 400, "batch.create"],
      ["a batch body that is an array", "POST", "/batches", { token: ana, rawBody: "[]" }, 400, "batch.create"],
      ["run of an unknown batch (404)", "POST", `/batches/${UNKNOWN}/run`, { token: ana }, 404, "batch.run"],
      ["run of a batch awaiting approval (409)", "POST", `/batches/${batchId}/run`, { token: ana }, 409, "batch.run"],
      [
        "run with a bad body",
        "POST",
        `/batches/${readyId}/run`,
        { token: ana, body: { maxDurationMs: 5 } },
        400,
        "batch.run",
      ],
      [
        "pause of a batch id that is not a UUID",
        "POST",
        "/batches/42/pause",
        { token: ana, body: { reason: "r" } },
        400,
        "batch.pause",
      ],
      [
        "stop of an unknown batch",
        "POST",
        `/batches/${UNKNOWN}/stop`,
        { token: ana, body: { reason: "r" } },
        404,
        "batch.stop",
      ],
      ["stop without a reason", "POST", `/batches/${readyId}/stop`, { token: ana, body: {} }, 400, "batch.stop"],
      [
        "resume of a batch that is not paused",
        "POST",
        `/batches/${readyId}/resume`,
        { token: ana, body: { reason: "r" } },
        409,
        "batch.resume",
      ],
      ["approve without the approver role", "POST", `/batches/${batchId}/approve`, { token: bo }, 403, "batch.approve"],
      [
        "approve of one's own batch",
        "POST",
        `/batches/${batchId}/approve`,
        { token: approverAna },
        403,
        "batch.approve",
      ],
      [
        "approve of an unknown batch",
        "POST",
        `/batches/${UNKNOWN}/approve`,
        { token: approverAna },
        404,
        "batch.approve",
      ],
      [
        "a body past the limit",
        "POST",
        "/dead-letters/discard",
        { token: ana, rawBody: `{"ids":[],"reason":"${"x".repeat(MAX_BODY_BYTES)}"}` },
        413,
        "dead_letter.discard",
      ],
    ];
    const before = (await auditRows()).length;
    for (const [name, method, path, options, status, action] of refusals) {
      const count = (await auditRows()).length;
      const response = await call(method, path, options);
      expect(response.status, name).toBe(status);
      const rows = await auditRows();
      expect(rows.length - count, `${name}: one audit row`).toBe(1);
      const who = options.token === bo ? "bo" : "ana";
      expect(rows.at(-1), name).toMatchObject({
        operator: who,
        action,
        result: status === 403 ? expect.stringMatching(/^(refused|rejected)$/) : "rejected",
      });
    }
    expect((await auditRows()).length - before).toBe(refusals.length);
    expect(errors).toEqual([]); // none of them was a 500
  });

  test("a credential that verifies but may not operate is audited under its subject, one row per call", async () => {
    const tenant = await token("t-user", { tenant_id: "acme", roles: ["ops:operator"] });
    for (let i = 0; i < 3; i++) {
      expect((await call("POST", "/dead-letters/discard", { token: tenant, body: {} })).status).toBe(403);
    }
    expect((await auditRows()).map((r) => [r.operator, r.result])).toEqual(
      Array.from({ length: 3 }, () => ["t-user (refused)", "refused"]),
    );
  });

  test("unauthenticated calls are coalesced: one row per source per minute, with the count", async () => {
    const forged = `${(await token("ana")).slice(0, -4)}AAAA`;
    for (let i = 0; i < 30; i++) {
      const response = await call("POST", i % 2 ? "/dead-letters/replay" : `/batches/${UNKNOWN}/approve`, {
        ...(i % 3 ? {} : { token: forged }),
        headers: { "x-forwarded-for": "203.0.113.7, 10.0.0.1" },
        body: { ids: [UNKNOWN], reason: "r" },
      });
      expect(response.status).toBe(401);
    }
    for (let i = 0; i < 5; i++) {
      await call("POST", "/batches", { headers: { "x-forwarded-for": "198.51.100.9" }, body: {} });
    }
    const rows = await auditRows();
    expect(rows).toHaveLength(2);
    const bySource = Object.fromEntries(rows.map((r) => [r.scope["source"], r]));
    expect(bySource["203.0.113.7"]).toMatchObject({
      operator: "(unauthenticated)",
      action: "http.unauthenticated",
      result: "refused",
      scope: { count: 30, actions: { "dead_letter.replay": 15, "batch.approve": 15 } },
    });
    expect(bySource["198.51.100.9"]?.scope).toMatchObject({ count: 5, actions: { "batch.create": 5 } });

    // The next minute starts new rows.
    clock.advance(60_000);
    await call("POST", "/batches", { headers: { "x-forwarded-for": "198.51.100.9" }, body: {} });
    expect(await auditRows()).toHaveLength(3);
  });

  test("a caller varying its claimed source cannot grow the audit past the cap per minute", async () => {
    clock.advance(60_000);
    const sources = MAX_SOURCES_PER_MINUTE + 50;
    for (let i = 0; i < sources; i++) {
      await call("POST", "/batches", { headers: { "x-forwarded-for": `192.0.2.${i}` }, body: {} });
    }
    const rows = await auditRows();
    expect(rows).toHaveLength(MAX_SOURCES_PER_MINUTE + 1);
    const other = rows.find((r) => r.scope["source"] === OTHER_SOURCES);
    expect(other?.scope["count"]).toBe(50);
  });
});

describe("bad ids and bytes are 400s before any query, never 500s (#10 item 6)", () => {
  test.each([
    ["POST", "/batches/42/pause", { reason: "r" }],
    ["POST", "/batches/not-a-uuid/stop", { reason: "r" }],
    ["POST", "/batches/42/resume", { reason: "r" }],
    ["POST", "/batches/42/approve", undefined],
    ["POST", "/batches/42/run", undefined],
    ["GET", "/batches/42", undefined],
    ["GET", "/dead-letters/42", undefined],
    ["GET", "/dead-letters/42/history", undefined],
    ["GET", `/batches/${UNKNOWN}%00`, undefined],
    ["GET", "/dead-letters?queue=a%00b", undefined],
    ["GET", "/dead-letters/count?tenantId=%00", undefined],
    ["GET", "/dead-letters?a%00=1", undefined],
    ["POST", "/batches", { reason: "r", ratePerSecond: 1, filter: { queue: "a\u0000b" } }],
    ["POST", "/batches", { reason: "r\u0000", ratePerSecond: 1 }],
  ])("%s %s answers 400", async (method, path, body) => {
    const response = await call(method, path, { token: await token("ana"), ...(body ? { body } : {}) });
    expect(response.status).toBe(400);
    expect(response.body.error?.code).toBe("INVALID_INPUT");
    expect(errors).toEqual([]);
  });

  test("the library refuses a malformed batch id before querying too", async () => {
    for (const verb of ["pause", "stop", "resume"] as const) {
      await expect(ops.batches[verb]("42", { operator: "ana", reason: "r" })).rejects.toMatchObject({
        code: "INVALID_INPUT",
        message: expect.stringMatching(/batch id.*UUID/),
      });
    }
    await expect(ops.deadLetters.count({ queue: "a\u0000b" })).rejects.toMatchObject({ code: "INVALID_INPUT" });
  });
});

describe("lists work without any filter (#10 item 11)", () => {
  test("ops.batches.list() and every HTTP list with no filter", async () => {
    await pendingLetters(1);
    await ops.batches.create({ operator: "ana", reason: "r", ratePerSecond: 5 });
    expect(await ops.batches.list()).toHaveLength(1);
    expect(await ops.batches.list({})).toHaveLength(1);
    const t = await token("ana");
    for (const path of [
      "/batches",
      "/dead-letters",
      "/dead-letters/count",
      "/dead-letters/depth",
      "/dead-letters/failed-after-replay",
    ]) {
      const response = await call("GET", path, { token: t });
      expect(response.status, path).toBe(200);
    }
    expect((await call("GET", "/batches", { token: t })).body).toMatchObject({ items: [expect.any(Object)] });
  });
});

describe("the body size limit: 413 without reading the whole body (#10 item 8)", () => {
  /** Streams `total` bytes in 64 KiB chunks, made only when the socket asks for them; returns the answer and how much was made by then. */
  function stream(total: number, headers: Record<string, string>) {
    let produced = 0;
    let finished = false;
    const body = new Readable({
      read() {
        if (produced >= total) {
          finished = true;
          this.push(null);
          return;
        }
        const n = Math.min(65_536, total - produced);
        produced += n;
        this.push(Buffer.alloc(n, 0x61));
      },
    });
    return new Promise<{ status: number; producedAtAnswer: number; finishedAtAnswer: boolean; text: string }>(
      (resolve, reject) => {
        const url = new URL(`${server.url}/ops/dead-letters/discard`);
        const req = httpRequest(url, { method: "POST", headers }, (res) => {
          const producedAtAnswer = produced;
          const finishedAtAnswer = finished;
          let text = "";
          res.on("data", (c) => (text += c));
          res.on("end", () => {
            body.destroy();
            resolve({ status: res.statusCode ?? 0, producedAtAnswer, finishedAtAnswer, text });
          });
        });
        // The server closing mid-upload is expected once it answered.
        req.on("error", (error) => (req.destroyed ? undefined : reject(error)));
        body.on("error", () => {});
        body.pipe(req);
      },
    );
  }
  const TWELVE_MB = 12 * 1024 * 1024;

  test("a streamed (chunked) 12 MB body is refused once it passes the limit; the handler stops reading there", async () => {
    const readBefore = server.bodyBytesRead();
    const answer = await stream(TWELVE_MB, {
      "content-type": "application/json",
      authorization: `Bearer ${await token("ana")}`,
    });
    expect(answer.status).toBe(413);
    expect(JSON.parse(answer.text)).toMatchObject({ error: { code: "PAYLOAD_TOO_LARGE" } });
    const read = server.bodyBytesRead() - readBefore;
    // It read past the limit by at most one chunk, and answered before the client had sent everything.
    expect(read).toBeGreaterThan(MAX_BODY_BYTES);
    expect(read).toBeLessThanOrEqual(MAX_BODY_BYTES + 65_536);
    expect(answer.finishedAtAnswer).toBe(false);
    expect(answer.producedAtAnswer).toBeLessThan(TWELVE_MB);
  });

  test("a 12 MB Content-Length is refused before reading any of the body", async () => {
    const readBefore = server.bodyBytesRead();
    const answer = await stream(TWELVE_MB, {
      "content-type": "application/json",
      "content-length": String(TWELVE_MB),
      authorization: `Bearer ${await token("ana")}`,
    });
    expect(answer.status).toBe(413);
    expect(server.bodyBytesRead() - readBefore).toBe(0);
    expect(answer.finishedAtAnswer).toBe(false);
  });

  test("an unauthenticated 12 MB body is answered 401 without reading it", async () => {
    const readBefore = server.bodyBytesRead();
    const answer = await stream(TWELVE_MB, { "content-type": "application/json" });
    expect(answer.status).toBe(401);
    expect(server.bodyBytesRead() - readBefore).toBe(0);
  });
});
