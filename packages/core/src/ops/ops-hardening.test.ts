/**
 * Operators' controls that must hold whatever the session, the clock or the
 * input (found by a second reader's probes; each failed before its fix):
 * a claim under a REPEATABLE READ database default still sees the pause it
 * waited for and the quota count it waited for; the HTTP API's login cannot
 * rewrite audit rows; the two-person ceiling counts a batch's claims for its
 * requester, whoever claims them; a batch expires by the database's clock
 * too; a sample that replayed nothing proves nothing; a date the database
 * cannot hold is bad input; an upper-case batch id is audited as the batch's
 * id; an operator's own login cannot backdate a batch's times.
 */
import { useTestDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import { SignJWT } from "jose";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { replayBatchRow } from "../../test/replay-batch-row.ts";
import { createManualClock } from "../clock.ts";
import { createEnvelope } from "../envelope.ts";
import type { PublishReceipt } from "../queue-port.ts";
import { sleep } from "../timers.ts";
import { createOps, createOpsHandler, jwtAuthorizer } from "./index.ts";
import type { ReplayTransport } from "./routes.ts";

const pg = useTestDatabase("ops-probes");
const QUEUE = "probes.q";
const CONSUMER = "probes.c";
const TAG = Math.random().toString(36).slice(2, 8);
const ANA = `sc_probe_ana_${TAG}`;
const BO = `sc_probe_bo_${TAG}`;
const SVC = `sc_probe_svc_${TAG}`;
const clients: postgres.Sql[] = [];

function loginAs(role: string): postgres.Sql {
  const url = new URL(pg.url);
  url.username = role;
  const c = postgres(url.toString(), { max: 2, onnotice: () => {} });
  clients.push(c);
  return c;
}

/** A pool whose sessions default to REPEATABLE READ (a database or role set so, which the README says is supported). */
function repeatableReadDb() {
  const c = postgres(pg.url, {
    max: 4,
    onnotice: () => {},
    connection: { default_transaction_isolation: "repeatable read" },
  });
  clients.push(c);
  return drizzle(c);
}

/** A transport that records publishes (stored), optionally slow. */
function recordingTransport(delayMs = 0): ReplayTransport & { published: string[] } {
  const published: string[] = [];
  return {
    published,
    route: () => ({ ok: true }),
    async publishReplay(_q, _c, body): Promise<PublishReceipt> {
      if (delayMs > 0) await sleep(delayMs);
      published.push(typeof body === "string" ? body : Buffer.from(body).toString());
      return { messageId: uuidv7(), stored: true };
    },
  };
}

async function letters(n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = uuidv7();
    const envelope = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { i } });
    await pg.sql`insert into core.dead_letters (id, job_id, tenant_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${id}, ${envelope.job_id}, 't', ${QUEUE}, ${CONSUMER}, ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    ids.push(id);
  }
  return ids;
}

async function waitingForAdvisoryLock(): Promise<boolean> {
  for (let i = 0; i < 300; i++) {
    const [row] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from pg_locks where locktype = 'advisory' and not granted`;
    if ((row?.n ?? 0) > 0) return true;
    await sleep(10);
  }
  return false;
}

beforeAll(async () => {
  await pg.sql.unsafe(`create role ${ANA} login in role softcrum_ops_operator`);
  await pg.sql.unsafe(`create role ${BO} login in role softcrum_ops_operator`);
  await pg.sql.unsafe(`create role ${SVC} login in role softcrum_ops_service`);
});
afterAll(async () => {
  for (const c of clients) await c.end({ timeout: 2 }).catch(() => {});
  for (const r of [ANA, BO, SVC]) await pg.sql.unsafe(`drop role if exists ${r}`).catch(() => {});
});
beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters, core.replay_batches, core.replay_batch_items, core.ops_audit cascade`;
});

describe("claim transaction under a REPEATABLE READ database default", () => {
  test("a pause that commits while a claim waits for the batch lock stops that claim", async () => {
    const [letter] = await letters(1);
    const transport = recordingTransport();
    const ops = createOps({ db: repeatableReadDb(), replay: transport });
    const batch = await ops.batches.create({ operator: "ana", reason: "probe", ratePerSecond: 1, batchSize: 1 });
    // The batch runs under runner R (as a runner's lease would make it).
    await pg.sql`select core.ops_batch_set(${batch.id}::uuid, 'lease', 'ana', null, 'R', null, 60000)`;

    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    // Operator bo pauses: the function holds the batch's lock until commit.
    const pausing = pg.sql.begin(async (tx) => {
      await tx`select core.ops_batch_set(${batch.id}::uuid, 'pause', 'bo', 'stop now', null, null, null)`;
      await gate;
    });
    await sleep(100);
    // The runner's claim of the next letter now waits for the lock.
    const claiming = ops.deadLetters.replayOne(letter as string, {
      operator: "ana",
      reason: "batch",
      batchId: batch.id,
      guard: { runner: "R", deadline: null },
    });
    expect(await waitingForAdvisoryLock()).toBe(true);
    release();
    await pausing; // the pause has returned: nothing may be replayed after it
    const result = await claiming;
    const [row] = await pg.sql<
      { status: string }[]
    >`select status from core.dead_letters where id = ${letter as string}`;
    expect({ outcome: result.outcome, status: row?.status, published: transport.published.length }).toEqual({
      outcome: "halted",
      status: "pending_review",
      published: 0,
    });
  });

  test("two direct replays of one operator at once never pass the approval threshold", async () => {
    const [a, b] = await letters(2);
    const transport = recordingTransport(400); // a slow publish keeps the first claim open
    const ops = createOps({ db: repeatableReadDb(), replay: transport, approvalThreshold: 1 });
    const first = ops.deadLetters.replay([a as string], { operator: "ana", reason: "one" });
    await sleep(150); // the first holds ana's quota lock, publishing
    const second = ops.deadLetters.replay([b as string], { operator: "ana", reason: "two" });
    await Promise.all([first, second]);
    const [row] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters where status = 'replayed' and status_changed_by = 'ana'`;
    // Threshold 1: one replay without a second operator's approval, never two.
    expect(row?.n).toBe(1);
  });
});

describe("roles", () => {
  test("the HTTP API's login cannot rewrite an existing audit row behind the functions", async () => {
    const id = uuidv7();
    await pg.sql`select core.ops_audit_write(${id}::uuid, now(), 'ana', 'dead_letter.discard', '{}'::jsonb, 'ok', 'x')`;
    const asService = loginAs(SVC);
    const outcome = await asService`
      update core.ops_audit set operator = 'nobody', result = 'refused', detail = 'rewritten' where id = ${id}`.then(
      () => "updated",
      (e: { code?: string }) => `refused ${e.code}`,
    );
    const [row] = await pg.sql<{ operator: string }[]>`select operator from core.ops_audit where id = ${id}`;
    expect({ outcome, operator: row?.operator }).toEqual({ outcome: "refused 42501", operator: "ana" });
  });

  test("the database's two-person ceiling counts a requester's unapproved batch replays whoever claims them", async () => {
    const ids = await letters(200);
    const asAna = loginAs(ANA);
    const asBo = loginAs(BO);
    const batchIds: string[] = [];
    for (const part of [ids.slice(0, 100), ids.slice(100)]) {
      const id = uuidv7();
      const row = replayBatchRow(id);
      // Each batch alone is at the ceiling, not over it: made "ready".
      await asAna`select core.ops_create_batch(${asAna.json(row)}::jsonb, null, false, ${part}::uuid[], 0)`;
      batchIds.push(id);
    }
    let claimed = 0;
    for (const [n, batchId] of batchIds.entries()) {
      await asBo`select core.ops_batch_set(${batchId}::uuid, 'lease', null, null, 'R', null, 60000)`;
      for (const letter of ids.slice(n * 100, n * 100 + 100)) {
        const rows = await asBo`
          select queue from core.ops_claim_letter(${letter}::uuid, null, 'by hand', ${batchId}::uuid, 'R')`.catch(
          () => [],
        );
        claimed += rows.length;
      }
    }
    const [count] = await pg.sql<{ n: number }[]>`select core.ops_unapproved_replays(${ANA}) as n`;
    // Neither ana's requests nor bo's login may pass 100 unapproved replays in 24 h.
    expect({ claimed, anaUnapproved: count?.n }).toEqual({ claimed: 100, anaUnapproved: 100 });
  });

  test("a running batch's letter is claimed only under the runner that leases the batch: by hand without it, refused", async () => {
    const ids = await letters(2);
    const asAna = loginAs(ANA);
    const asBo = loginAs(BO);
    const batchId = uuidv7();
    const row = replayBatchRow(batchId);
    await asAna`select core.ops_create_batch(${asAna.json(row)}::jsonb, null, false, ${ids}::uuid[], 0)`;
    await asAna`select core.ops_batch_set(${batchId}::uuid, 'lease', null, null, 'R', null, 60000)`;
    // Past the runner: its pacing, its sample gate and its stop conditions.
    const byHand = await asBo`
      select queue from core.ops_claim_letter(${ids[0] as string}::uuid, null, 'by hand', ${batchId}::uuid, null)`.then(
      () => "claimed",
      (error: { code?: string }) => error.code,
    );
    expect(byHand).toBe("55000");
    const [left] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters where id = any(${ids}::uuid[]) and status = 'pending_review'`;
    expect(left?.n).toBe(2);
    // Under the runner that leases it, the claim goes.
    const byRunner = await asAna`
      select queue from core.ops_claim_letter(${ids[1] as string}::uuid, null, 'batch', ${batchId}::uuid, 'R')`;
    expect(byRunner).toHaveLength(1);
  });
});

describe("expiry is the database's, not a runner's clock", () => {
  test("a runner whose clock lags does not claim letters of a batch past its expiresAt", async () => {
    await letters(3);
    const transport = recordingTransport();
    const ops = createOps({ db: pg.db, replay: transport });
    const expiresAt = new Date(Date.now() + 1_000);
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "probe",
      ratePerSecond: 100,
      batchSize: 3,
      expiresAt,
    });
    await sleep(1_300); // expired for the database (and for the machine that made it)
    // A second machine whose clock is 10 minutes behind runs it.
    const lagging = createManualClock(Date.now() - 600_000);
    const behind = createOps({ db: pg.db, replay: transport, clock: lagging });
    const view = await behind.batches.run(batch.id, { operator: "bo" });
    const [late] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from core.dead_letters where status = 'replayed' and status_changed_at >= ${expiresAt.toISOString()}::timestamptz`;
    expect({ status: view.status, late: late?.n, published: transport.published.length }).toEqual({
      status: "expired",
      late: 0,
      published: 0,
    });
  });
});

describe("audit trail", () => {
  test("a batch control given with an upper-case id is found by the batch's id in the audit", async () => {
    await letters(1);
    const ops = createOps({ db: pg.db, replay: recordingTransport() });
    const batch = await ops.batches.create({ operator: "ana", reason: "probe", ratePerSecond: 1 });
    await ops.batches.pause(batch.id.toUpperCase(), { operator: "bo", reason: "looking" });
    const rows = await pg.sql<{ action: string }[]>`
      select action from core.ops_audit where scope->>'batchId' = ${batch.id} order by id`;
    expect(rows.map((r) => r.action)).toEqual(["batch.create", "batch.pause"]);
  });
});

describe("the sample gate", () => {
  test("a sample none of whose letters was replayed (all handled elsewhere meanwhile) does not pass", async () => {
    const ids = await letters(5);
    const transport = recordingTransport();
    const ops = createOps({ db: pg.db, replay: transport, batchPolicy: { pollIntervalMs: 20 } });
    const batch = await ops.batches.create({
      operator: "ana",
      reason: "probe",
      ratePerSecond: 100,
      batchSize: 5,
      sampleSize: 2,
    });
    // The two sample letters (the oldest) are discarded before the run: the sample will check nothing.
    await ops.deadLetters.discard(ids.slice(0, 2), { operator: "bo", reason: "handled by hand" });
    const view = await ops.batches.run(batch.id, { operator: "ana" });
    // Nothing was proven by a sample: the rest must not go out unreviewed.
    expect({ status: view.status, published: transport.published.length }).toEqual({
      status: "paused",
      published: 0,
    });
  });
});

describe("HTTP input", () => {
  const SECRET = "a-probe-secret-that-is-at-least-32-bytes-long";
  const token = () =>
    new SignJWT({ sub: "ana", roles: ["ops:operator"] })
      .setProtectedHeader({ alg: "HS256" })
      .setIssuedAt()
      .setExpirationTime("5m")
      .sign(new TextEncoder().encode(SECRET));

  test.each([
    ["GET", "/dead-letters?createdAfter=0000-01-01T00:00:00Z", undefined],
    ["GET", "/dead-letters/count?createdBefore=9999-12-31T23:59:59-14:00", undefined],
    ["POST", "/batches", { filter: { createdAfter: "0000-01-01T00:00:00Z" }, reason: "x", ratePerSecond: 1 }],
  ] as const)("%s %s with a date the database cannot hold is a 4xx, not a 500", async (method, path, body) => {
    await letters(1);
    const logged: string[] = [];
    const handler = createOpsHandler({
      ops: createOps({ db: pg.db, replay: recordingTransport() }),
      authorize: jwtAuthorizer({ secret: SECRET }),
      logger: { warn: () => {}, error: (m: string) => logged.push(m) } as never,
    });
    const response = await handler(
      new Request(`http://ops.test${path}`, {
        method,
        headers: { authorization: `Bearer ${await token()}`, "content-type": "application/json" },
        ...(body ? { body: JSON.stringify(body) } : {}),
      }),
    );
    expect({ status: response.status, logged }).toEqual({ status: 400, logged: [] });
  });
});

describe("times an operator's own login gives", () => {
  test("a batch's recorded times are the database's for a login it does not trust (as ops_time does elsewhere)", async () => {
    await letters(1);
    const ops = createOps({ db: pg.db, replay: recordingTransport() });
    const batch = await ops.batches.create({ operator: ANA, reason: "probe", ratePerSecond: 1 });
    const asAna = loginAs(ANA);
    await asAna`select core.ops_batch_set(${batch.id}::uuid, 'stop', null, 'done', null, '2000-01-01T00:00:00Z'::timestamptz, null)`;
    const [row] = await pg.sql<{ backdated: boolean }[]>`
      select ended_at < now() - interval '1 hour' as backdated from core.replay_batches where id = ${batch.id}`;
    expect(row?.backdated).toBe(false);
  });
});
