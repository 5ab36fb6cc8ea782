/**
 * The two-person rule's ceiling held by the database (#21 item 3,
 * migration 0025): an operator's own login cannot pass 100 unapproved
 * replays in 24 hours even by calling the core.ops_* functions by hand.
 */
import { useTestDatabase } from "@softcrum/testing";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { replayBatchRow } from "../../test/replay-batch-row.ts";
import { createEnvelope } from "../envelope.ts";

const pg = useTestDatabase("approval-ceiling");
// Login roles are cluster-wide: one of its own per run, dropped afterwards.
const OPERATOR = `sc_ceiling_${Math.random().toString(36).slice(2, 10)}`;
let asOperator: postgres.Sql;

beforeAll(async () => {
  await pg.sql.unsafe(`create role ${OPERATOR} login in role softcrum_ops_operator`);
  const url = new URL(pg.url);
  url.username = OPERATOR;
  asOperator = postgres(url.toString(), { max: 1, onnotice: () => {} });
});
afterAll(async () => {
  await asOperator?.end({ timeout: 2 });
  await pg.sql.unsafe(`drop role if exists ${OPERATOR}`);
});

/** `n` letters; `replayedBy` marks them replayed by that login just now, without a batch. */
async function letters(n: number, replayedBy?: string): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = uuidv7();
    const envelope = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { i } });
    await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (${id}, ${envelope.job_id}, 'ceiling.q', 'ceiling.c', ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
    if (replayedBy) {
      await pg.sql`update core.dead_letters set status = 'replayed', status_changed_at = now(),
        status_changed_by = ${replayedBy}, status_reason = 'x' where id = ${id}`;
    }
    ids.push(id);
  }
  return ids;
}

describe("the database holds the two-person ceiling of 100 unapproved replays a day", () => {
  test("below it a claim by hand goes through; at it the claim is refused, and a batch by hand waits for approval", async () => {
    const [first] = await letters(1);
    const [claimed] = await asOperator`
      select queue from core.ops_claim_letter(${first as string}::uuid, null, 'by hand', null, null)`;
    expect(claimed).toEqual({ queue: "ceiling.q" });

    await letters(99, OPERATOR); // 100 unapproved replays of this login in the window now
    const [next] = await letters(1);
    const refused = await asOperator`
      select * from core.ops_claim_letter(${next as string}::uuid, null, 'by hand', null, null)`.then(
      () => "allowed",
      (e: { code?: string; message?: string }) => `${e.code}: ${e.message}`,
    );
    expect(refused).toMatch(/^42501: .* replayed 100 letters without a second person's approval in 24 hours/);
    const [still] = await pg.sql<
      { status: string }[]
    >`select status from core.dead_letters where id = ${next as string}`;
    expect(still?.status).toBe("pending_review");

    // A batch made by hand as "ready" (no approval needed, says the caller) waits for approval.
    const id = uuidv7();
    const row = replayBatchRow(id);
    await asOperator`select core.ops_create_batch(${asOperator.json(row)}::jsonb, null, false, ${[next as string]}::uuid[], 0)`;
    const [batch] = await pg.sql<{ status: string; requested_by: string }[]>`
      select status, requested_by from core.replay_batches where id = ${id}`;
    expect(batch).toEqual({ status: "awaiting_approval", requested_by: OPERATOR });
  });

  test("a session the database trusts (the schema's owner, the HTTP API's role) is held by the library's rule instead", async () => {
    const [free] = await letters(1);
    await letters(100, "someone");
    const [claimed] = await pg.sql`
      select queue from core.ops_claim_letter(${free as string}::uuid, 'someone', 'owner', null, null)`;
    expect(claimed).toEqual({ queue: "ceiling.q" });
  });
});
