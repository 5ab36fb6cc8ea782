// Found by `pnpm chaos` (#12 item 1): a delivery that never settled, its
// worker wedged. postgres.js 3.4.9 queues a reservation's queries in a list
// of its own once the connection's pipeline is "full" — which it is after any
// statement the connection has not prepared yet (describe first), so on every
// fresh connection. When the socket closes (backend terminated, server
// restarted) with queries in that list, nothing rejects them: the harness's
// pipelined BEGIN + lock + fence awaited them forever. The patch
// (patches/postgres@3.4.9.patch) rejects them with CONNECTION_CLOSED.
import { useTestDatabase } from "@softcrum/testing";
import postgres from "postgres";
import { expect, test } from "vitest";

const pg = useTestDatabase("reserved_close");

test("queries queued behind an unprepared statement on a reserved connection are rejected when its backend is terminated (#12)", async () => {
  const applicationName = `reserved-close-${process.pid}`;
  const sql = postgres(pg.url, { max: 1, onnotice: () => {}, connection: { application_name: applicationName } });
  try {
    const conn = await sql.reserve();
    // Parameters on a fresh connection: described first, so the pipeline is
    // "full" and the next two wait in the reservation's own list.
    const first = conn.unsafe("select pg_sleep(5), $1::int as n", [1], { prepare: true });
    const second = conn.unsafe("select $1::int as n", [2], { prepare: true });
    const third = conn.unsafe("select $1::int as n", [3], { prepare: true });
    const settled = Promise.allSettled([first, second, third]);
    // Wait until the first one runs, then end its backend.
    for (let i = 0; i < 200; i++) {
      const [row] = await pg.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity
        where application_name = ${applicationName} and state = 'active' and query like 'select pg_sleep%'`;
      if (row?.n === 1) break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await pg.sql`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${applicationName}`;

    const outcome = await Promise.race([
      settled,
      new Promise<string>((resolve) => setTimeout(() => resolve("still pending 3 s after the backend died"), 3_000)),
    ]);
    expect(outcome).not.toBe("still pending 3 s after the backend died");
    const results = outcome as PromiseSettledResult<unknown>[];
    expect(results.map((r) => r.status)).toEqual(["rejected", "rejected", "rejected"]);
    expect(results.map((r) => (r.status === "rejected" ? (r.reason as { code?: string }).code : "ok"))).toEqual([
      expect.any(String),
      "CONNECTION_CLOSED",
      "CONNECTION_CLOSED",
    ]);
    conn.release();
    // The pool still serves queries.
    expect(await sql`select 1 as n`).toEqual([{ n: 1 }]);
  } finally {
    await sql.end({ timeout: 1 });
  }
});
