// The operator queries of #9 item 13 on tables large enough for the planner
// to care: the replay-DLQ view and a letter's history must use indexes, page
// every row exactly once, and take more failures than Postgres takes bind
// parameters; the audit is pruned, never inside its retention.
import { useTestDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import { uuidv7 } from "uuidv7";
import { beforeAll, describe, expect, test } from "vitest";
import { recordingClient } from "../../test/recording-client.ts";
import { createMemoryQueue } from "../adapters/memory/index.ts";
import { isSoftcrumError } from "../errors.ts";
import { createOps, type Ops } from "./index.ts";

const pg = useTestDatabase("ops-replay-scale");
const BATCH_A = "0190b3c4-aaaa-7000-8000-000000000001"; // 70,000 replayed letters, each failed again once
const BATCH_B = "0190b3c4-bbbb-7000-8000-000000000002"; // 13,020 replayed letters, failures after the first 12,000 only
const LETTER_WITH_HISTORY = "0190b3c4-cccc-7000-8000-000000000003";

/** A UUID whose order is `major`, then `minor`. */
const orderedId = (major: string, minor: string) =>
  `lpad(to_hex(${major}), 8, '0') || '-0000-7000-8000-' || lpad(to_hex(${minor}), 12, '0')`;

const columns = `id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
  created_at, status_changed_at, status_changed_by, status_reason, replay_batch_id`;

beforeAll(async () => {
  const sql = pg.sql;
  // 100,000 unrelated pending letters, so the table is not small.
  await sql.unsafe(`
    insert into core.dead_letters (${columns})
    select gen_random_uuid(), gen_random_uuid()::text, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'pending_review',
           now() - interval '5 days', null, null, null, null
    from generate_series(1, 100000)`);
  // Batch A: 70,000 replayed letters (more than the 65,535 bind parameters a statement takes), each failed again.
  // 30,000 direct replays, one in ten failed again.
  await sql.unsafe(`
    with replayed as (
      insert into core.dead_letters (${columns})
      select gen_random_uuid(), gen_random_uuid()::text, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'replayed',
             now() - interval '3 days', now() - interval '2 days', 'ops', 'r',
             case when i <= 70000 then '${BATCH_A}'::uuid end
      from generate_series(1, 100000) i
      returning job_id, replay_batch_id, id
    )
    insert into core.dead_letters (${columns})
    select gen_random_uuid(), job_id, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'pending_review',
           now() - interval '1 day', null, null, null, null
    from replayed where replay_batch_id is not null or ('x' || substr(id::text, 1, 8))::bit(32)::int % 10 = 0`);
  // Batch B, ids in a known order: letters 1..12000 never failed again (the first pages read only them);
  // of 12001..13000, every 5th failed again, every 10th also has a discarded failure before that one,
  // and every 50th's failure was replayed in its turn and failed once more (a chain).
  await sql.unsafe(`
    insert into core.dead_letters (${columns})
    select (${orderedId("i", "1")})::uuid, 'b-' || i, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'replayed',
           now() - interval '3 days', now() - interval '2 days', 'ops', 'r', '${BATCH_B}'::uuid
    from generate_series(1, 13000) i;
    insert into core.dead_letters (${columns})
    select (${orderedId("i", "3")})::uuid, 'b-' || i, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'discarded',
           now() - interval '40 hours', now() - interval '39 hours', 'ops', 'no', null
    from generate_series(12010, 13000, 10) i;
    insert into core.dead_letters (${columns})
    select (${orderedId("i", "2")})::uuid, 'b-' || i, 'q', 'scale.c', '{}', 5, 'e', 'exhausted',
           case when i % 50 = 0 then 'replayed' else 'pending_review' end,
           now() - interval '30 hours',
           case when i % 50 = 0 then now() - interval '20 hours' end,
           case when i % 50 = 0 then 'ops' end, 'r',
           case when i % 50 = 0 then '${BATCH_B}'::uuid end
    from generate_series(12005, 13000, 5) i;
    insert into core.dead_letters (${columns})
    select (${orderedId("i", "4")})::uuid, 'b-' || i, 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'pending_review',
           now() - interval '10 hours', null, null, null, null
    from generate_series(12050, 13000, 50) i`);
  // 200,000 audit entries naming other letters and batches; 120 name one letter.
  await sql.unsafe(`
    insert into core.ops_audit (id, at, operator, action, scope, result)
    select gen_random_uuid(), now() - make_interval(secs => i), 'ops', 'dead_letter.discard',
           case when i % 4 = 0 then jsonb_build_object('batchId', gen_random_uuid())
                else jsonb_build_object('ids', jsonb_build_array(gen_random_uuid(), gen_random_uuid()), 'reason', 'r') end,
           'ok'
    from generate_series(1, 200000) i;
    insert into core.dead_letters (${columns})
    values ('${LETTER_WITH_HISTORY}', 'h-1', 'q', 'scale.c', '{}', 5, 'e', 'exhausted', 'pending_review',
            now(), null, null, null, null)`);
  for (let i = 0; i < 120; i++) {
    await sql`
      insert into core.ops_audit (id, at, operator, action, scope, result)
      values (${uuidv7()}, now(), ${`op-${i}`}, 'dead_letter.discard',
              ${JSON.stringify({ ids: [LETTER_WITH_HISTORY, uuidv7()], reason: "r" })}::jsonb, 'rejected')`;
  }
  await sql`analyze core.dead_letters`;
  await sql`analyze core.ops_audit`;
}, 120_000);

const queue = () => createMemoryQueue();
const opsOn = (db = pg.db): Ops => createOps({ db, queue: queue() });

/** A plan node of `EXPLAIN (FORMAT JSON)`. */
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  Plans?: PlanNode[];
}
const nodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(nodes)];

/** The plans of the statements `run` sends that read `relation`. */
async function plansOf(run: (ops: Ops) => Promise<unknown>, relation: string): Promise<PlanNode[][]> {
  const { client, statements } = recordingClient(pg.url);
  try {
    await run(opsOn(drizzle({ client })));
  } finally {
    await client.end();
  }
  const plans: PlanNode[][] = [];
  for (const { query, parameters } of statements.filter((s) => s.query.includes(relation))) {
    const [row] = await pg.sql.unsafe<{ "QUERY PLAN": { Plan: PlanNode }[] }[]>(
      `explain (format json) ${query}`,
      parameters as never[],
    );
    plans.push(nodes(row?.["QUERY PLAN"][0]?.Plan as PlanNode));
  }
  return plans;
}

/** Every page of the replay view, following nextCursor to the end. */
async function allPages(ops: Ops, filter: { batchId?: string }, limit: number) {
  const seen: { id: string; replayedFrom: string; batchId: string | null }[] = [];
  let cursor: string | undefined;
  let pages = 0;
  let shortPagesWithMore = 0;
  for (;;) {
    const page = await ops.deadLetters.failedAfterReplay(filter, { limit, ...(cursor ? { cursor } : {}) });
    pages += 1;
    expect(page.items.length).toBeLessThanOrEqual(limit);
    seen.push(...page.items.map((l) => ({ id: l.id, replayedFrom: l.replayedFrom, batchId: l.batchId })));
    if (!page.nextCursor) break;
    if (page.items.length < limit) shortPagesWithMore += 1;
    cursor = page.nextCursor;
  }
  return { seen, pages, shortPagesWithMore };
}

describe("the replay-DLQ view and letter history at scale (#9 item 13)", () => {
  test("the replay view starts from replayed letters through an index, with or without a batch, and never scans dead_letters (#9 item 13)", async () => {
    for (const filter of [{}, { batchId: BATCH_A }]) {
      const plans = await plansOf((ops) => ops.deadLetters.failedAfterReplay(filter, { limit: 50 }), "dead_letters");
      expect(plans.length).toBeGreaterThan(0);
      const all = plans.flat();
      const onLetters = all.filter((n) => n["Relation Name"] === "dead_letters");
      expect(onLetters.filter((n) => /Seq Scan/.test(n["Node Type"]))).toEqual([]);
      const expected = "batchId" in filter ? "dead_letters_replayed_batch_idx" : "dead_letters_replayed_idx";
      expect(onLetters.map((n) => n["Index Name"])).toContain(expected);
    }
  });

  test("a letter's history is read through the index on the audit's ids, not by scanning the audit (#9 item 13)", async () => {
    const plans = await plansOf((ops) => ops.deadLetters.history(LETTER_WITH_HISTORY), "ops_audit");
    const onAudit = plans.flat().filter((n) => n["Relation Name"] === "ops_audit");
    expect(onAudit.length).toBeGreaterThan(0);
    expect(onAudit.filter((n) => /Seq Scan/.test(n["Node Type"]))).toEqual([]);
    expect(plans.flat().map((n) => n["Index Name"])).toContain("ops_audit_scope_ids_idx");
  });

  test("a batch with 70,000 failures after replay (more than 65,535 bind parameters) pages through every one exactly once (#9 item 13)", async () => {
    const { seen, pages } = await allPages(opsOn(), { batchId: BATCH_A }, 500);
    expect(seen).toHaveLength(70_000);
    expect(new Set(seen.map((l) => l.id)).size).toBe(70_000);
    expect(new Set(seen.map((l) => l.replayedFrom)).size).toBe(70_000);
    expect(new Set(seen.map((l) => l.batchId))).toEqual(new Set([BATCH_A]));
    expect(pages).toBe(140);
  }, 120_000);

  test("paging returns every failure exactly once, under the latest replay before it, across short pages that a bounded scan ends (#9 item 13)", async () => {
    const { seen, shortPagesWithMore } = await allPages(opsOn(), { batchId: BATCH_B }, 7);
    // The first 12,000 replayed letters never failed again: pages that read 5,000 of them find nothing and say "more".
    expect(shortPagesWithMore).toBeGreaterThanOrEqual(2);
    // What the unpaged view of main listed for this batch: each later letter under its latest earlier replay.
    const expected = await pg.sql<{ id: string; replayed_from: string }[]>`
      select n.id::text, o.id::text as replayed_from
      from core.dead_letters n
      cross join lateral (
        select o.id, o.replay_batch_id from core.dead_letters o
        where o.job_id = n.job_id and o.consumer = n.consumer and o.id <> n.id
          and o.status = 'replayed' and o.status_changed_at <= n.created_at
        order by o.status_changed_at desc limit 1
      ) o
      where n.job_id like 'b-%' and o.replay_batch_id = ${BATCH_B}`;
    expect(expected).toHaveLength(200 + 100 + 20);
    expect(seen.map((l) => `${l.replayedFrom}>${l.id}`).sort()).toEqual(
      expected.map((r) => `${r.replayed_from}>${r.id}`).sort(),
    );
    expect(new Set(seen.map((l) => l.id)).size).toBe(seen.length);
    // In order: by the replayed letter, then the failure.
    const keys = seen.map((l) => `${l.replayedFrom}.${l.id}`);
    expect(keys).toEqual([...keys].sort());
  });

  test("a letter's history comes a page at a time: get shows the first 100 entries, history() the rest, each once (#9 item 13)", async () => {
    const ops = opsOn();
    const detail = await ops.deadLetters.get(LETTER_WITH_HISTORY);
    expect(detail.history).toHaveLength(100);
    expect(detail.historyNextCursor).not.toBeNull();
    const rest = await ops.deadLetters.history(LETTER_WITH_HISTORY, { cursor: detail.historyNextCursor as string });
    expect(rest.items).toHaveLength(20);
    expect(rest.nextCursor).toBeNull();
    const operators = [...detail.history, ...rest.items].map((h) => h.operator);
    expect(operators).toEqual(Array.from({ length: 120 }, (_, i) => `op-${i}`));
  });
});

describe("audit retention (#9 item 13)", () => {
  test("prune deletes only entries older than the retention, refuses a retention under the floor, and is audited (#9 item 13)", async () => {
    const sql = pg.sql;
    await sql`truncate core.ops_audit`;
    const ages = [1, 29, 31, 399, 401, 800];
    for (const days of ages) {
      await sql`
        insert into core.ops_audit (id, at, operator, action, scope, result)
        select gen_random_uuid(), now() - make_interval(days => ${days}) + make_interval(mins => i), ${`age-${days}`},
               'dead_letter.discard', '{}', 'ok'
        from generate_series(1, 3) i`;
    }
    const ops = opsOn();
    const remaining = async () =>
      (await sql<{ operator: string }[]>`select distinct operator from core.ops_audit where operator like 'age-%'`)
        .map((r) => r.operator)
        .sort();

    let refused: unknown;
    await ops.deadLetters.pruneAudit({ operator: "ana", retentionDays: 29 }).catch((e: unknown) => {
      refused = e;
    });
    expect(isSoftcrumError(refused) && refused.code === "INVALID_INPUT").toBe(true);
    expect((refused as Error).message).toMatch(/at least 30 days/);

    const dry = await ops.deadLetters.pruneAudit({ operator: "ana", retentionDays: 400, dryRun: true, batchSize: 2 });
    expect(dry).toMatchObject({ deleted: 6, dryRun: true });
    expect(await remaining()).toHaveLength(6);

    const run = await ops.deadLetters.pruneAudit({ operator: "ana", retentionDays: 400, batchSize: 2 });
    expect(run).toMatchObject({ deleted: 6, batches: 4, dryRun: false });
    expect(await remaining()).toEqual(["age-1", "age-29", "age-31", "age-399"]);
    // The database records each deletion itself, a row per transaction (#21 item 3).
    const deletions = await sql<{ detail: string }[]>`
      select detail from core.ops_changes where change = 'ops_audit.deleted' order by id`;
    expect(deletions.map((d) => d.detail.split(",")[0])).toEqual(["2 entries", "2 entries", "2 entries"]);

    expect((await ops.deadLetters.pruneAudit({ operator: "ana", retentionDays: 30 })).deleted).toBe(6);
    expect(await remaining()).toEqual(["age-1", "age-29"]);
    const [oldest] = await sql<{ inside: boolean }[]>`
      select min(at) > now() - interval '30 days' as inside from core.ops_audit`;
    expect(oldest?.inside).toBe(true);

    const prunes = await sql<{ result: string; detail: string }[]>`
      select result, detail from core.ops_audit where action = 'audit.prune' order by id`;
    expect(prunes.map((p) => p.result)).toEqual(["rejected", "ok", "ok", "ok"]);
    expect(prunes[2]?.detail).toMatch(/^deleted 6 entries older than /);
  });
});
