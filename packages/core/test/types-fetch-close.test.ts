// Found by `pnpm chaos` (#12 item 1): a process died of an unhandled
// rejection (CONNECTION_CLOSED) while Postgres restarted. postgres.js 3.4.9
// fetches the server's array types on a new connection from its
// ReadyForQuery handler and never handles that query's promise: when the
// socket closes during that fetch, the rejection is unhandled and Node ends
// the process (a worker, or the chaos run itself). The patch
// (patches/postgres@3.4.9.patch) catches it; closing the socket already fails
// or retries whatever waited for the connection.
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { useTestDatabase } from "@softcrum/testing";
import postgres from "postgres";
import { afterEach, expect, test } from "vitest";

const pg = useTestDatabase("types_fetch_close");

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.close();
  }
});

/**
 * A TCP proxy to the test database's server that cuts the first connection
 * whose client sends the array-types query, instead of forwarding it.
 */
async function cuttingProxy(): Promise<{ port: number; cuts: () => number }> {
  const upstream = new URL(pg.url);
  let cuts = 0;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const target = createConnection(Number(upstream.port || 5432), upstream.hostname);
    sockets.add(client).add(target);
    client.on("data", (chunk: Buffer) => {
      if (cuts === 0 && chunk.includes("pg_catalog.pg_type")) {
        // Never answered: the connection closes with the fetch in flight.
        cuts += 1;
        client.destroy();
        target.destroy();
        return;
      }
      target.write(chunk);
    });
    target.on("data", (chunk: Buffer) => client.write(chunk));
    client.on("close", () => target.destroy());
    target.on("close", () => client.destroy());
    client.on("error", () => {});
    target.on("error", () => {});
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  return { port: typeof address === "object" && address ? address.port : 0, cuts: () => cuts };
}

test("a connection that closes while postgres.js fetches the array types leaves no unhandled rejection, and the reserve() waiting for it still gets a connection (#12)", async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on("unhandledRejection", onUnhandled);
  const proxy = await cuttingProxy();
  const url = new URL(pg.url);
  url.host = `127.0.0.1:${proxy.port}`;
  const sql = postgres(url.toString(), { max: 1, onnotice: () => {}, backoff: () => 0.05, connect_timeout: 5 });
  try {
    const reserved = await Promise.race([
      sql.reserve(),
      new Promise<string>((resolve) => setTimeout(() => resolve("no connection within 5 s"), 5_000)),
    ]);
    if (typeof reserved === "string") expect.fail(reserved);
    expect(await reserved`select 1 as n`).toEqual([{ n: 1 }]);
    reserved.release();
    // Let a rejection nobody handled surface.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(proxy.cuts()).toBe(1);
    expect(unhandled.map(String)).toEqual([]);
  } finally {
    process.off("unhandledRejection", onUnhandled);
    await sql.end({ timeout: 1 });
  }
});
