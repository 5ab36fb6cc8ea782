import { useTestDatabase } from "@softcrum/testing";
import { SignJWT } from "jose";
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { z } from "zod";
import { createEffectsTable, effects, silentLogger } from "../../test/fixtures.ts";
import { createMemoryQueue, type MemoryQueue } from "../adapters/memory/index.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { PermanentError } from "../errors.ts";
import { createOps, createOpsHandler, jwtAuthorizer, type Ops } from "./index.ts";

const pg = useTestDatabase("ops-http");
const SECRET = "a-test-secret-that-is-at-least-32-bytes-long";
const broken = new Set<string>();
const consumer = defineConsumer({
  name: "http.award",
  queue: "http.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    if (broken.has(data.customerId)) throw new PermanentError("broken");
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "http.award", amount: data.points });
  },
});

let queue: MemoryQueue;
let ops: Ops;
let handle: (request: Request) => Promise<Response>;

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
beforeEach(async () => {
  await pg.sql`truncate test_effects, core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
  queue = createMemoryQueue();
  queue.subscribe(bindConsumer(consumer, { db: pg.db, logger: silentLogger }));
  // Every batch awaits approval; direct replays keep the default threshold.
  ops = createOps({ db: pg.db, queue, approvalThreshold: 100, batchPolicy: { approvalThreshold: 0 } });
  handle = createOpsHandler({
    ops,
    authorize: jwtAuthorizer({ secret: SECRET }),
    basePath: "/ops",
    logger: silentLogger,
  });
});
afterEach(async () => {
  await queue.close();
});

async function token(claims: Record<string, unknown>, options: { secret?: string; expiresIn?: string } = {}) {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: "HS256" })
    .setIssuedAt()
    .setExpirationTime(options.expiresIn ?? "5m")
    .sign(new TextEncoder().encode(options.secret ?? SECRET));
}
const operator = (sub = "ana", roles = ["ops:operator"]) => token({ sub, roles });

async function call(method: string, path: string, options: { token?: string; body?: unknown; rawBody?: string } = {}) {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (options.token) headers["authorization"] = `Bearer ${options.token}`;
  const response = await handle(
    new Request(`http://ops.test/ops${path}`, {
      method,
      headers,
      ...(options.rawBody !== undefined
        ? { body: options.rawBody }
        : options.body !== undefined
          ? { body: JSON.stringify(options.body) }
          : {}),
    }),
  );
  return {
    status: response.status,
    body: (await response.json()) as Record<string, unknown> & { error?: { code: string; message: string } },
  };
}

async function deadLetter(customerId = "c1") {
  broken.add(customerId);
  const envelope = createEnvelope({ tenantId: "acme", kind: "points.award.v1", data: { customerId, points: 9 } });
  await queue.publish("http.points", envelope);
  await queue.drain();
  const [row] = await pg.sql<{ id: string }[]>`select id from core.dead_letters where job_id = ${envelope.job_id}`;
  return { id: row?.id as string, envelope };
}
const snapshot = () => pg.sql`select id, status, status_reason from core.dead_letters order by id`;

describe("authentication and roles", () => {
  test.each([
    ["no credential", async () => undefined, 401, /operator token is required/],
    [
      "a token signed with another key (tampered)",
      () => token({ sub: "ana", roles: ["ops:operator"] }, { secret: "x".repeat(40) }),
      401,
      /not valid/,
    ],
    [
      "an expired token",
      () =>
        token({ sub: "ana", roles: ["ops:operator"], exp: Math.floor(Date.now() / 1000) - 60 }, { expiresIn: "-1m" }),
      401,
      /expired/,
    ],
    [
      "a tenant credential",
      () => token({ sub: "t-user", tenant_id: "acme", roles: ["ops:operator"] }),
      403,
      /tenant credential/,
    ],
    [
      "a token without the operator role",
      () => token({ sub: "ana", roles: ["reader"] }),
      403,
      /ops:operator role is required/,
    ],
    [
      "a token that never expires",
      () =>
        new SignJWT({ sub: "ana", roles: ["ops:operator"] })
          .setProtectedHeader({ alg: "HS256" })
          .sign(new TextEncoder().encode(SECRET)),
      401,
      /not valid/,
    ],
  ])("%s is refused and changes nothing", async (_name, makeToken, status, message) => {
    const { id } = await deadLetter();
    const before = await snapshot();
    const t = await makeToken();
    for (const [method, path, body] of [
      ["GET", "/dead-letters", undefined],
      ["POST", "/dead-letters/discard", { ids: [id], reason: "x" }],
      ["POST", "/dead-letters/replay", { ids: [id], reason: "x" }],
      ["POST", "/batches", { reason: "x", ratePerSecond: 10 }],
    ] as const) {
      const response = await call(method, path, { ...(t ? { token: t } : {}), ...(body ? { body } : {}) });
      expect(response.status).toBe(status);
      expect(response.body.error?.message).toMatch(message);
    }
    expect(await snapshot()).toEqual(before);
    expect(await pg.sql`select 1 from core.replay_batches`).toHaveLength(0);
    const audit = await pg.sql<
      { operator: string; result: string; scope: { count?: number } }[]
    >`select operator, result, scope from core.ops_audit`;
    if (status === 403) {
      // A credential that verified but was refused names its subject: one row per mutating call.
      expect(audit.map((a) => a.result)).toEqual(["refused", "refused", "refused"]);
      for (const row of audit) expect(row.operator).toMatch(/^(t-user|ana) \(refused\)$/);
    } else {
      // No identity proven: the three mutating calls are counted in one row per source and minute
      // (#10 item 5); two rows only if the calls straddled a minute.
      expect(audit.length).toBeLessThanOrEqual(2);
      for (const row of audit) expect(row).toMatchObject({ operator: "(unauthenticated)", result: "refused" });
      expect(audit.reduce((n, row) => n + (row.scope.count ?? 0), 0)).toBe(3);
    }
  });

  test("a payload edited after signing is refused", async () => {
    const good = await operator("ana", ["ops:operator"]);
    const [header, , signature] = good.split(".");
    const forged = Buffer.from(
      JSON.stringify({ sub: "mallory", roles: ["ops:operator", "ops:approver"], exp: 9_999_999_999 }),
    ).toString("base64url");
    const response = await call("GET", "/dead-letters", { token: `${header}.${forged}.${signature}` });
    expect(response.status).toBe(401);
  });

  test("approving a batch needs the approver role, and someone other than the requester", async () => {
    await deadLetter("a1");
    const created = await call("POST", "/batches", {
      token: await operator("ana"),
      body: { reason: "fixed", ratePerSecond: 50 },
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ status: "awaiting_approval", requestedBy: "ana", selected: 1 });
    const id = created.body["id"] as string;

    const noRole = await call("POST", `/batches/${id}/approve`, { token: await operator("bo") });
    expect(noRole.status).toBe(403);
    const refused = await pg.sql`select operator, result from core.ops_audit where action = 'batch.approve'`;
    expect(refused).toEqual([{ operator: "bo", result: "refused" }]);
    const self = await call("POST", `/batches/${id}/approve`, {
      token: await operator("ana", ["ops:operator", "ops:approver"]),
    });
    expect(self.status).toBe(403);
    expect(self.body.error?.message).toMatch(/cannot approve it/);
    const approved = await call("POST", `/batches/${id}/approve`, {
      token: await operator("bo", ["ops:operator", "ops:approver"]),
    });
    expect(approved).toMatchObject({ status: 200, body: { status: "ready", approvedBy: "bo" } });
  });
});

describe("operations over HTTP", () => {
  test("list, get, replay and discard work for an operator, who is taken from the token", async () => {
    const a = await deadLetter("h1");
    const b = await deadLetter("h2");
    const t = await operator("ana");
    const list = await call("GET", "/dead-letters?tenantId=acme&limit=1&order=oldest", { token: t });
    expect(list.status).toBe(200);
    expect((list.body["items"] as { id: string }[]).map((i) => i.id)).toEqual([a.id]);
    expect(list.body["nextCursor"]).toBe(a.id);
    expect((await call("GET", "/dead-letters/count?errorClass=permanent", { token: t })).body).toEqual({ count: 2 });

    const one = await call("GET", `/dead-letters/${a.id}`, { token: t });
    expect(one.body).toMatchObject({ id: a.id, envelope: a.envelope, status: "pending_review" });

    broken.clear();
    const replay = await call("POST", "/dead-letters/replay", { token: t, body: { ids: [a.id], reason: "fixed" } });
    expect(replay).toMatchObject({ status: 200, body: { counts: { replayed: 1 } } });
    await queue.drain();
    const [effect] = await pg.sql<
      { n: number }[]
    >`select count(*)::int as n from test_effects where job_id = ${a.envelope.job_id}`;
    expect(effect?.n).toBe(1);
    // Its replay ran: replaying it again is refused, by outcome, not by status code.
    const again = await call("POST", "/dead-letters/replay-again", {
      token: t,
      body: { ids: [a.id], reason: "again" },
    });
    expect(again).toMatchObject({ status: 200, body: { counts: { not_pending: 1 } } });

    const discard = await call("POST", "/dead-letters/discard", {
      token: t,
      body: { ids: [b.id], reason: "customer left" },
    });
    expect(discard.body).toMatchObject({ counts: { discarded: 1 } });
    const [row] = await pg.sql<
      { status_changed_by: string }[]
    >`select status_changed_by from core.dead_letters where id = ${b.id}`;
    expect(row?.status_changed_by).toBe("ana");
    const audit = await pg.sql<{ operator: string; action: string; result: string }[]>`
      select operator, action, result from core.ops_audit order by at`;
    expect(audit).toEqual([
      { operator: "ana", action: "dead_letter.replay", result: "ok" },
      { operator: "ana", action: "dead_letter.replay_again", result: "refused" },
      { operator: "ana", action: "dead_letter.discard", result: "ok" },
    ]);
  });

  test("a batch can be created, approved, run in steps and inspected", async () => {
    await deadLetter("s1");
    await deadLetter("s2");
    broken.clear();
    const created = await call("POST", "/batches", {
      token: await operator("ana"),
      body: { reason: "fixed", ratePerSecond: 100, filter: { tenantId: "acme" } },
    });
    const id = created.body["id"] as string;
    await call("POST", `/batches/${id}/approve`, { token: await operator("bo", ["ops:operator", "ops:approver"]) });
    const run = await call("POST", `/batches/${id}/run`, {
      token: await operator("bo"),
      body: { maxDurationMs: 5000 },
    });
    expect(run).toMatchObject({ status: 200, body: { status: "completed", replayed: 2 } });
    const listed = await call("GET", "/batches?status=completed", { token: await operator("bo") });
    expect((listed.body["items"] as { id: string }[]).map((b) => b.id)).toEqual([id]);
  });

  test.each([
    ["POST", "/dead-letters/discard", "{not json", 400, /body is not valid JSON/],
    [
      "POST",
      "/dead-letters/discard",
      JSON.stringify({ ids: ["x"], reason: "r" }),
      400,
      /ids.0: must be a dead-letter id/,
    ],
    ["POST", "/dead-letters/discard", JSON.stringify({ ids: ["0190b3c4-0000-7000-8000-000000000000"] }), 400, /reason/],
    ["POST", "/dead-letters/replay", JSON.stringify({ ids: [], reason: "r" }), 400, /at least one id/],
    ["GET", "/dead-letters?errorClass=nope", undefined, 400, /errorClass/],
    ["GET", "/dead-letters?tenant=acme", undefined, 400, /tenant/],
    ["GET", "/dead-letters?createdAfter=soon", undefined, 400, /createdAfter: must be a date/],
    ["GET", "/dead-letters?limit=0", undefined, 400, /limit/],
    [
      "POST",
      "/batches",
      JSON.stringify({ reason: "x", ratePerSecond: 5, operator: "someone-else" }),
      400,
      /without `operator`/,
    ],
    ["POST", "/batches", JSON.stringify({ reason: "x" }), 400, /ratePerSecond/],
    ["GET", "/batches?status=weird", undefined, 400, /status/],
    ["GET", "/dead-letters/0190b3c4-0000-7000-8000-000000000000", undefined, 404, /no dead letter/],
    ["GET", "/batches/0190b3c4-0000-7000-8000-000000000000", undefined, 404, /no replay batch/],
    ["GET", "/nothing-here", undefined, 404, /no route/],
    ["DELETE", "/dead-letters", undefined, 405, /DELETE/],
    ["GET", "/dead-letters/%E0%A4%A", undefined, 400, /bad percent-encoding/],
  ])("%s %s with %s answers %i with a useful message", async (method, path, rawBody, status, message) => {
    const response = await call(method, path, {
      token: await operator(),
      ...(rawBody !== undefined ? { rawBody } : {}),
    });
    expect(response.status).toBe(status);
    expect(response.body.error?.message).toMatch(message);
  });

  test("a state conflict is 409", async () => {
    const { id } = await deadLetter("k1");
    const t = await operator("ana");
    const created = await call("POST", "/batches", {
      token: t,
      body: { reason: "x", ratePerSecond: 10, filter: { consumer: "http.award" } },
    });
    expect(created.body).toMatchObject({ status: "awaiting_approval" });
    const run = await call("POST", `/batches/${created.body["id"]}/run`, { token: t });
    expect(run.status).toBe(409);
    expect(run.body.error?.message).toMatch(/awaits approval/);
    expect(id).toBeTruthy();
  });

  test("the replay view and a letter's history are paged over HTTP, and an unknown query parameter is refused (#9 item 13)", async () => {
    const a = await deadLetter("p1");
    const b = await deadLetter("p2");
    const t = await operator("ana");
    // Both replayed, both still broken: each fails again.
    await call("POST", "/dead-letters/replay", { token: t, body: { ids: [a.id, b.id], reason: "try" } });
    await queue.drain();

    const first = await call("GET", "/dead-letters/failed-after-replay?limit=1", { token: t });
    expect(first.status).toBe(200);
    expect(first.body["items"]).toHaveLength(1);
    expect(first.body["nextCursor"]).toEqual(expect.any(String));
    const second = await call(
      "GET",
      `/dead-letters/failed-after-replay?limit=1&cursor=${encodeURIComponent(first.body["nextCursor"] as string)}`,
      { token: t },
    );
    expect(second.body["items"]).toHaveLength(1);
    expect(second.body["nextCursor"]).toBeNull();
    const replayedFrom = [first, second].map((p) => (p.body["items"] as { replayedFrom: string }[])[0]?.replayedFrom);
    expect(new Set(replayedFrom)).toEqual(new Set([a.id, b.id]));

    const typo = await call("GET", "/dead-letters/failed-after-replay?batch=x", { token: t });
    expect(typo.status).toBe(400);
    expect(typo.body.error?.message).toMatch(/unknown query parameter "batch"/);
    const badCursor = await call("GET", "/dead-letters/failed-after-replay?cursor=nope", { token: t });
    expect(badCursor.status).toBe(400);

    const history = await call("GET", `/dead-letters/${a.id}/history?limit=1`, { token: t });
    expect(history.status).toBe(200);
    expect(history.body["items"]).toEqual([expect.objectContaining({ operator: "ana", action: "dead_letter.replay" })]);
    expect(history.body["nextCursor"]).toBeNull();
    const one = await call("GET", `/dead-letters/${a.id}`, { token: t });
    expect(one.body).toMatchObject({ historyNextCursor: null });
  });
});
