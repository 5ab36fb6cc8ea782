import { useTestDatabase } from "@softcrum/testing";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import { durableCommit, LOOKED_UP_DURABLE_COMMIT } from "./commit.ts";

const db = useTestDatabase("durable-commit");
const pools = new Map<string, postgres.Sql>();
afterAll(() => Promise.all([...pools.values()].map((pool) => pool.end())));

/** A pool whose sessions' own synchronous_commit is `session` (a startup parameter, as a role or database default would be). */
function poolWith(session: string): postgres.Sql {
  let pool = pools.get(session);
  if (pool === undefined) {
    pool = postgres(db.url, { max: 1, onnotice: () => {}, connection: { synchronous_commit: session } });
    pools.set(session, pool);
  }
  return pool;
}

/**
 * What synchronous_commit a COMMIT runs with after the durable commit's
 * statements, in a session whose own value is `session` and a transaction
 * that set it to `local` (off, as a handler may).
 */
async function modeAfter(statements: string, session: string, local = "off"): Promise<string> {
  const rows = await poolWith(session).begin(async (tx) => {
    await tx.unsafe(`set local synchronous_commit = ${local}`);
    await tx.unsafe(statements);
    return tx.unsafe<{ synchronous_commit: string }[]>("show synchronous_commit");
  });
  return rows[0]?.synchronous_commit ?? "none";
}

describe("the durable commit's target, learned once per pool", () => {
  test.each([
    ["on", "on"],
    ["remote_apply", "remote_apply"],
    ["local", "local"],
    // A session whose own value is off: the commit still flushes locally.
    ["off", "local"],
    // A value this version does not know is not trusted to be durable.
    ["fsync", "local"],
  ])("a pool that learned %s turns a transaction's off into %s", async (learned, expected) => {
    const statements = durableCommit(learned).beforeCommit;
    expect(await modeAfter(statements, "on")).toBe(expected);
  });

  test("a value learned before the session's own changed (a reload, a role default) is still durable: the pool's on is what a session whose value is now off commits with", async () => {
    expect(await modeAfter(durableCommit("on").beforeCommit, "off")).toBe("on");
  });

  test("a pool that has not learned the value looks the session's own up on the server", async () => {
    expect(await modeAfter(LOOKED_UP_DURABLE_COMMIT.beforeCommit, "on")).toBe("on");
    expect(await modeAfter(durableCommit(undefined).beforeCommit, "off")).toBe("local");
  });

  test("a setting stricter than off is left as the transaction set it", async () => {
    expect(await modeAfter(durableCommit("on").beforeCommit, "on", "remote_write")).toBe("remote_write");
  });

  test("the commit check of a driver that proves by transaction id makes the same change", async () => {
    expect(await modeAfter(durableCommit("remote_apply").openXid, "on")).toBe("remote_apply");
  });
});
