import { useTestDatabase } from "@softcrum/testing";
import { drizzle } from "drizzle-orm/postgres-js";
import { beforeAll, describe, expect, test } from "vitest";
import { createManualClock } from "../clock.ts";
import { cachedDepth, type DepthRow } from "./depth.ts";
import { createOps, type Ops } from "./index.ts";

const pg = useTestDatabase("ops-scale");
const LETTERS = 200_000;
/** Every 10th letter is pending review; the rest were replayed. */
const captured: { query: string; params: unknown[] }[] = [];
let ops: Ops;

beforeAll(async () => {
  // 200k letters, 20k pending, spread by a hash of their number: 200 tenants, 10 queues x 2 consumers, 20 kinds, 4 error classes.
  await pg.sql.unsafe(`
    insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status,
      tenant_id, kind, created_at, status_changed_at, status_changed_by)
    select gen_random_uuid(), gen_random_uuid()::text, 'queue-' || ((hashint4(i * 31 + 1)::bigint + 2147483648) % 10), 'consumer-' || ((hashint4(i * 31 + 2)::bigint + 2147483648) % 2), '{}', 5,
      'boom', (array['poison', 'exhausted', 'permanent', 'expired'])[1 + (hashint4(i * 31 + 3)::bigint + 2147483648) % 4],
      case when i % 10 = 0 then 'pending_review' else 'replayed' end,
      'tenant-' || ((hashint4(i * 31 + 4)::bigint + 2147483648) % 200), 'kind-' || ((hashint4(i * 31 + 5)::bigint + 2147483648) % 20), now() - make_interval(secs => i),
      case when i % 10 = 0 then null else now() end, case when i % 10 = 0 then null else 'ops' end
    from generate_series(1, ${LETTERS}) as i`);
  await pg.sql.unsafe("vacuum analyze core.dead_letters");
  const db = drizzle({
    client: pg.sql,
    logger: { logQuery: (query, params) => captured.push({ query, params }) },
  });
  ops = createOps({
    db,
    queue: {
      publish: async () => ({ messageId: null, stored: true }),
      schedule: async () => ({ messageId: null, stored: true }),
    },
  });
}, 120_000);

interface PlanNode {
  "Node Type": string;
  "Index Name"?: string;
  "Relation Name"?: string;
  Plans?: PlanNode[];
}
const nodesOf = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(nodesOf)];

/** The plan of the one query `run` sends, as "Node Type [index]" per node that reads dead_letters. */
async function planOf(run: () => Promise<unknown>): Promise<string[]> {
  captured.length = 0;
  await run();
  expect(captured).toHaveLength(1);
  const [{ query, params }] = captured as [{ query: string; params: unknown[] }];
  const [row] = await pg.sql.unsafe(`explain (format json) ${query}`, params as never[]);
  const plan = (row as unknown as { "QUERY PLAN": [{ Plan: PlanNode }] })["QUERY PLAN"][0].Plan;
  return nodesOf(plan)
    .filter((n) => n["Relation Name"] === "dead_letters" || n["Index Name"])
    .map((n) => `${n["Node Type"]}${n["Index Name"] ? ` ${n["Index Name"]}` : ""}`);
}

const pending = { status: "pending_review" } as const;

describe("operator queries at scale use the partial indexes on pending letters", () => {
  test.each([
    [
      "list by tenant",
      () => ops.deadLetters.list({ ...pending, tenantId: "tenant-7" }),
      "dead_letters_pending_tenant_idx",
    ],
    [
      "list by tenant, oldest first, from a cursor",
      () =>
        ops.deadLetters.list(
          { ...pending, tenantId: "tenant-7" },
          { order: "oldest", cursor: "00000000-0000-4000-8000-000000000000" },
        ),
      "dead_letters_pending_tenant_idx",
    ],
    [
      "count by tenant",
      () => ops.deadLetters.count({ ...pending, tenantId: "tenant-7" }),
      "dead_letters_pending_tenant_idx",
    ],
    [
      "list by queue and consumer",
      () => ops.deadLetters.list({ ...pending, queue: "queue-3", consumer: "consumer-1" }),
      "dead_letters_pending_queue_consumer_idx",
    ],
    [
      "count by queue and consumer",
      () => ops.deadLetters.count({ ...pending, queue: "queue-3", consumer: "consumer-1" }),
      // An index-only count; (queue, consumer, status) from 0000 serves it as well.
      "dead_letters_pending_queue_consumer_idx|dead_letters_queue_consumer_idx",
    ],
    [
      "list by kind and error class",
      () => ops.deadLetters.list({ ...pending, kind: "kind-4", errorClass: "poison" }),
      "dead_letters_pending_kind_class_idx",
    ],
    [
      "count by kind and error class",
      () => ops.deadLetters.count({ ...pending, kind: "kind-4", errorClass: "poison" }),
      "dead_letters_pending_kind_class_idx",
    ],
  ])("%s: an index scan on its partial index, no sequential scan (#9 item 10)", async (_name, run, index) => {
    const plan = await planOf(run);
    expect(plan.filter((n) => n.startsWith("Seq Scan"))).toEqual([]);
    const used = plan.some((n) => /Index( Only)? Scan/.test(n) && index.split("|").some((i) => n.endsWith(` ${i}`)));
    expect(used, plan.join(", ")).toBe(true);
  });

  test("the depth gauge's query is an index-only scan of the pending letters, no sequential scan (#9 item 11)", async () => {
    const plan = await planOf(() => ops.deadLetters.depth());
    expect(plan.filter((n) => n.startsWith("Seq Scan"))).toEqual([]);
    expect(plan).toContain("Index Only Scan dead_letters_pending_queue_consumer_idx");
    const rows = await ops.deadLetters.depth();
    expect(rows).toHaveLength(20);
    expect(rows.reduce((sum, r) => sum + r.pending, 0)).toBe(LETTERS / 10);
  });
});

describe("the depth gauge reads once per interval per process", () => {
  test("concurrent collections share one query, a result within maxAgeMs is reused, a failed read is not kept (#9 item 11)", async () => {
    const clock = createManualClock(1_000_000);
    const row: DepthRow = { queue: "q", consumer: "c", pending: 3, oldestPendingAgeMs: 500 };
    const reads: { resolve: (rows: DepthRow[]) => void; reject: (error: Error) => void }[] = [];
    const depth = cachedDepth(
      () =>
        new Promise<DepthRow[]>((resolve, reject) => {
          reads.push({ resolve, reject });
        }),
      { maxAgeMs: 30_000, clock },
    );

    const concurrent = [depth(), depth(), depth()];
    await Promise.resolve();
    await Promise.resolve();
    expect(reads).toHaveLength(1);
    reads[0]?.resolve([row]);
    expect(await Promise.all(concurrent)).toEqual([[row], [row], [row]]);

    // Within maxAgeMs: no query, the age moved on with the clock.
    clock.advance(10_000);
    expect(await depth()).toEqual([{ ...row, oldestPendingAgeMs: 10_500 }]);
    expect(reads).toHaveLength(1);

    // Past maxAgeMs: one new query for the next collections; a failure reaches them all and is not cached.
    clock.advance(20_000);
    const failing = [depth(), depth()];
    await Promise.resolve();
    await Promise.resolve();
    expect(reads).toHaveLength(2);
    reads[1]?.reject(new Error("database down"));
    for (const result of await Promise.allSettled(failing)) expect(result.status).toBe("rejected");
    const retried = depth();
    await Promise.resolve();
    await Promise.resolve();
    expect(reads).toHaveLength(3);
    reads[2]?.resolve([]);
    expect(await retried).toEqual([]);
  });

  test("with the real depth query: concurrent gauge collections send one query (#9 item 11)", async () => {
    const depth = cachedDepth(() => ops.deadLetters.depth());
    captured.length = 0;
    const results = await Promise.all([depth(), depth(), depth(), depth()]);
    expect(captured).toHaveLength(1);
    expect(new Set(results.map((r) => r.length))).toEqual(new Set([20]));
    await depth();
    expect(captured).toHaveLength(1);
  });
});
