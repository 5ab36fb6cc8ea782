/**
 * #21 item 10, the suspected holes, each verified: a tenant claim in any
 * spelling is refused; operators whose `sub` differs only in case are one
 * person to the two-person rule; the HS256 authorizer accepts HS256 only;
 * `GET /batches` refuses parameters it does not know and pages.
 */
import { useTestDatabase } from "@softcrum/testing";
import { SignJWT } from "jose";
import { uuidv7 } from "uuidv7";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { type ServedFetch, serveFetch } from "../../test/serve-fetch.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { createEnvelope } from "../envelope.ts";
import { createOps, createOpsHandler, jwtAuthorizer, type Ops } from "./index.ts";

const pg = useTestDatabase("ops-http-hardening");
const SECRET = "a-test-secret-that-is-at-least-32-bytes-long";
let ops: Ops;
let server: ServedFetch;

beforeAll(async () => {
  ops = createOps({ db: pg.db, queue: createMemoryQueue(), batchPolicy: { approvalThreshold: 1 } });
  server = await serveFetch(
    createOpsHandler({
      ops,
      authorize: jwtAuthorizer({ secret: SECRET }),
      basePath: "/ops",
      logger: { warn: () => {}, error: () => {} },
    }),
  );
});
afterAll(async () => {
  await server?.close();
});
beforeEach(async () => {
  await pg.sql`truncate core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
});

const token = (
  sub: string,
  claims: Record<string, unknown> = { roles: ["ops:operator", "ops:approver"] },
  alg = "HS256",
) =>
  new SignJWT({ sub, ...claims })
    .setProtectedHeader({ alg })
    .setIssuedAt()
    .setExpirationTime("5m")
    .sign(new TextEncoder().encode(SECRET));

async function call(method: string, path: string, bearer: string, body?: unknown) {
  const response = await fetch(`${server.url}/ops${path}`, {
    method,
    headers: { "content-type": "application/json", authorization: `Bearer ${bearer}` },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

async function pendingLetters(n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const envelope = createEnvelope({ tenantId: "acme", kind: "k.v1", data: { i } });
    await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${uuidv7()}, ${envelope.job_id}, 'q', 'c', ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
  }
}

describe("the authorizer", () => {
  test.each([["tenant_id"], ["tenantId"], ["TenantId"], ["tenant-id"], ["tenant"]])(
    "a token carrying %s is refused (403) whatever its roles",
    async (claim) => {
      const bearer = await token("ana", { roles: ["ops:operator"], [claim]: "acme" });
      const { status, body } = await call("GET", "/batches", bearer);
      expect(status).toBe(403);
      expect(JSON.stringify(body)).toMatch(/tenant/);
    },
  );

  test.each(["HS384", "HS512"])(
    "a token signed %s with the configured secret is refused (the algorithm is pinned)",
    async (alg) => {
      const { status } = await call("GET", "/batches", await token("ana", { roles: ["ops:operator"] }, alg));
      expect(status).toBe(401);
    },
  );

  test("subjects that differ only in case are one operator: Ana cannot approve ana's batch", async () => {
    await pendingLetters(3);
    const created = await call("POST", "/batches", await token("ana"), { reason: "x", ratePerSecond: 1 });
    expect(created.status).toBe(201);
    expect(created.body["status"]).toBe("awaiting_approval");
    const approved = await call("POST", `/batches/${created.body["id"]}/approve`, await token("ANA"));
    expect(approved.status).toBe(403);
    expect((await ops.batches.get(String(created.body["id"]))).status).toBe("awaiting_approval");
  });
});

describe("GET /batches", () => {
  test("an unknown or misspelt parameter is 400, never the whole list", async () => {
    const { status, body } = await call("GET", "/batches?stauts=ready", await token("ana"));
    expect(status).toBe(400);
    expect(JSON.stringify(body)).toMatch(/stauts/);
  });

  test("pages with limit and cursor", async () => {
    await pendingLetters(1);
    for (let i = 0; i < 3; i++) await ops.batches.create({ operator: "ana", reason: `r${i}`, ratePerSecond: 1 });
    const bearer = await token("ana");
    const first = await call("GET", "/batches?limit=2", bearer);
    expect(first.status).toBe(200);
    const items = first.body["items"] as { id: string }[];
    expect(items).toHaveLength(2);
    expect(first.body["nextCursor"]).toBe(items[1]?.id);
    const second = await call("GET", `/batches?limit=2&cursor=${first.body["nextCursor"]}`, bearer);
    expect((second.body["items"] as unknown[]).length).toBe(1);
    expect(second.body["nextCursor"]).toBeNull();
    expect((await call("GET", "/batches?limit=0", bearer)).status).toBe(400);
  });
});
