import { useTestDatabase } from "@softcrum/testing";
import { sql as dsql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { recordCommitModes } from "../../test/commit-modes.ts";
import { createEffectsTable, effects, silentLogger, testConsumers } from "../../test/fixtures.ts";
import { bindConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { BEFORE_COMMIT_SQL, OPEN_XID_SQL } from "./commit.ts";

const db = useTestDatabase("durable-commit");
const pools: postgres.Sql[] = [];
afterAll(() => Promise.all(pools.map((pool) => pool.end())));

/** A pool whose sessions' own synchronous_commit is `session` (a startup parameter, as a role or database default would be). */
function poolWith(session: string): postgres.Sql {
  const pool = postgres(db.url, { max: 1, onnotice: () => {}, connection: { synchronous_commit: session } });
  pools.push(pool);
  return pool;
}

/**
 * The synchronous_commit a COMMIT runs with after `statements`, in a session
 * whose own value is `session` and a transaction that set it to `local`
 * (off, as a handler may).
 */
async function modeAfter(statements: string, session: string, local = "off"): Promise<string> {
  const rows = await poolWith(session).begin(async (tx) => {
    await tx.unsafe(`set local synchronous_commit = ${local}`);
    await tx.unsafe(statements);
    return tx.unsafe<{ synchronous_commit: string }[]>("show synchronous_commit");
  });
  return rows[0]?.synchronous_commit ?? "none";
}

describe("the durable commit's statements turn a transaction's off into the session's own setting", () => {
  test.each([
    ["on", "on"],
    ["remote_apply", "remote_apply"],
    ["remote_write", "remote_write"],
    ["local", "local"],
    // A session whose own value is off: the commit still flushes locally.
    ["off", "local"],
  ])("a session whose own value is %s: %s", async (session, expected) => {
    expect(await modeAfter(BEFORE_COMMIT_SQL, session)).toBe(expected);
    // The commit check of a driver that proves by transaction id does the same.
    expect(await modeAfter(OPEN_XID_SQL, session)).toBe(expected);
  });

  test("a setting stricter than off is left as the transaction set it", async () => {
    for (const statements of [BEFORE_COMMIT_SQL, OPEN_XID_SQL]) {
      expect(await modeAfter(statements, "on", "remote_write")).toBe("remote_write");
      expect(await modeAfter(statements, "local", "remote_apply")).toBe("remote_apply");
    }
  });

  test("the value is the transaction's own, not a reset one that keeps the configuration as its source: a reload between the commit check and COMMIT (separate messages where the transaction id proves the commit) cannot replace it", async () => {
    const rows = await poolWith("on").begin(async (tx) => {
      await tx.unsafe("set local synchronous_commit = off");
      await tx.unsafe(OPEN_XID_SQL);
      return tx.unsafe<{ setting: string; source: string }[]>(
        "select setting, source from pg_settings where name = 'synchronous_commit'",
      );
    });
    expect(rows[0]).toEqual({ setting: "on", source: "session" });
  });
});

describe("the session's own setting is read at COMMIT, not remembered by the pool", () => {
  const POOL = "softcrum_durable_commit_pool";
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  const name = () => new URL(db.url).pathname.slice(1);
  beforeAll(() => createEffectsTable(db.sql));
  afterAll(() => db.sql.unsafe(`alter database "${name()}" reset synchronous_commit`));

  test("a database default changed after the pool's first job: a handler's off becomes the new default on the pool's next connection", async () => {
    // Its connection closes once idle, so the next job gets a new session.
    const pool = postgres(db.url, {
      max: 1,
      idle_timeout: 0.2,
      onnotice: () => {},
      connection: { application_name: POOL },
    });
    pools.push(pool);
    const definition = testConsumers("durable")(async (data, { tx, envelope }) => {
      await tx.execute(dsql`set local synchronous_commit = off`);
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
    });
    const bound = bindConsumer(definition, { db: drizzle({ client: pool }), logger: silentLogger });
    const deliver = async (n: number) =>
      (
        await bound.deliver({
          body: JSON.stringify(createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } })),
          deliveryCount: 1,
        })
      ).outcome;
    const recorder = await recordCommitModes({ rows: (text, params) => db.sql.unsafe(text, params as never[]) });
    try {
      expect(await deliver(1)).toBe("success");
      await db.sql.unsafe(`alter database "${name()}" set synchronous_commit = remote_apply`);
      // The pool's connection ends (closed by the pool itself: gone from the
      // server); its next one starts with the new default.
      while ((await db.sql`select 1 from pg_stat_activity where application_name = ${POOL}`).length > 0)
        await sleep(50);
      expect(await deliver(2)).toBe("success");
      expect(await recorder.modes()).toEqual([
        ["test_effects", "on"],
        ["test_effects", "remote_apply"],
      ]);
    } finally {
      await recorder.drop();
    }
  });
});
