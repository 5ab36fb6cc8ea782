/**
 * The harness through a transaction-mode pooler (#8 item 13): PgBouncer, which
 * the setup starts on a spare port in front of the test database, and a
 * postgres.js client with `prepare: false`, as deployments behind PgBouncer or
 * Supavisor use it. Without pgbouncer installed the file is skipped with a
 * one-line hint, except under CI=true, where that is a failure.
 */
import { connect, createServer, type Server, type Socket } from "node:net";
import { findPgBouncer, NO_PGBOUNCER_MESSAGE, type PgBouncer, startPgBouncer, upstreamOf } from "@softcrum/testing";
import { sql as dsql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { bindConsumer, type ConsumerDefinition, defineConsumer, type HarnessDeps } from "../src/consumer.ts";
import { createEnvelope } from "../src/envelope.ts";
import type { BoundConsumer, Delivery, DeliveryResult } from "../src/queue-port.ts";
import { effects, silentLogger, useEffectsDatabase } from "./fixtures.ts";

const pg = useEffectsDatabase("pooler");

/** postgres.js reads `max_pipeline` (default 100) but its types leave it out. */
type ClientOptions = postgres.Options<never> & { max_pipeline?: number };

const POOL_SIZE = 5; // PgBouncer's server connections for the test database
const hasPgBouncer = findPgBouncer() !== undefined;
if (!hasPgBouncer) {
  if (process.env["CI"] && process.env["CI"] !== "false")
    throw new Error(`CI=${process.env["CI"]}: ${NO_PGBOUNCER_MESSAGE}`);
  console.warn(`[pooler.test] skipped: ${NO_PGBOUNCER_MESSAGE}`);
}

const schema = z.object({ customerId: z.string(), points: z.number().int() });
let consumerSeq = 0;
function consumer(
  handle: ConsumerDefinition<typeof schema>["handle"],
  extra: Partial<ConsumerDefinition<typeof schema>> = {},
) {
  consumerSeq += 1;
  return defineConsumer({
    name: `test.pooler-${consumerSeq}`,
    queue: "test.pooler",
    kind: "points.award.v1",
    schema,
    handle,
    ...extra,
  });
}

const job = (customerId = "c-1") =>
  createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId, points: 1 } });

/**
 * Runs the deliveries `inFlight` at a time, in order; a `retry` outcome is
 * redelivered at once with the next delivery count, as a transport would.
 */
async function deliverAll(bound: BoundConsumer, deliveries: Delivery[], inFlight: number): Promise<DeliveryResult[]> {
  const queue = [...deliveries];
  const results: DeliveryResult[] = [];
  const worker = async () => {
    for (let next = queue.shift(); next; next = queue.shift()) {
      let delivery = next;
      for (;;) {
        const result = await bound.deliver(delivery);
        results.push(result);
        if (result.outcome !== "retry") break;
        delivery = { ...delivery, deliveryCount: delivery.deliveryCount + 1 };
      }
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
  return results;
}

const outcomes = (results: DeliveryResult[]) => {
  const counts: Record<string, number> = {};
  for (const r of results) counts[r.outcome] = (counts[r.outcome] ?? 0) + 1;
  return counts;
};

/** Fences without an effect, and jobs whose effect count is not exactly one, for one consumer. */
async function ledger(name: string) {
  const [row] = await pg.sql<{ fences: number; effects: number; jobs: number; orphanFences: number; notOne: number }[]>`
    select
      (select count(*)::int from core.processed_jobs where consumer = ${name}) as fences,
      (select count(*)::int from test_effects where consumer = ${name}) as effects,
      (select count(distinct job_id)::int from test_effects where consumer = ${name}) as jobs,
      (select count(*)::int from core.processed_jobs p where p.consumer = ${name}
         and not exists (select 1 from test_effects e where e.job_id = p.job_id and e.consumer = ${name})) as "orphanFences",
      (select count(*)::int from (select job_id from test_effects where consumer = ${name}
         group by job_id having count(*) <> 1) x) as "notOne"`;
  return row;
}

describe.skipIf(!hasPgBouncer)("through PgBouncer in transaction mode (#8 item 13)", () => {
  let bouncer: PgBouncer;
  const clients: postgres.Sql[] = [];
  /** A postgres.js client on the test database through `url` (PgBouncer unless given), as a pooler wants it. */
  const connectVia = (max: number, url: string, options: ClientOptions = {}) => {
    const sql = postgres(url, { prepare: false, max, onnotice: () => {}, ...options });
    clients.push(sql);
    return drizzle({ client: sql });
  };
  const connectPooled = (max: number) => connectVia(max, bouncer.url(pg.name));

  beforeAll(async () => {
    bouncer = await startPgBouncer({ ...upstreamOf(pg.url), databases: [pg.name], poolSize: POOL_SIZE });
  });
  afterAll(async () => {
    await Promise.all(clients.map((sql) => sql.end({ timeout: 5 })));
    await bouncer?.stop();
  });

  test("2,000 jobs, 32 in flight over 5 server connections, with duplicates and failures: one effect per job, every fence has its effect, failed attempts left nothing (#8 item 13)", async () => {
    const failFirst = new Set<string>();
    const backends = new Set<number>();
    let name = "";
    const c = consumer(async (data, { tx, envelope, attempt }) => {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: attempt });
      // A second statement of the same transaction sees the first: both ran on one server connection, in one transaction.
      const [seen] = (await tx.execute(
        dsql`select pg_backend_pid() as pid, (select count(*)::int from test_effects where job_id = ${envelope.job_id}) as n`,
      )) as unknown as { pid: number; n: number }[];
      if (seen?.n !== 1) throw new Error(`the transaction does not see its own insert (saw ${seen?.n})`);
      backends.add(seen.pid);
      if (attempt === 1 && failFirst.has(envelope.job_id)) throw new Error(`provider down for ${data.customerId}`);
    });
    name = c.name;
    const bound = bindConsumer(c, { db: connectPooled(32), logger: silentLogger });

    const deliveries: Delivery[] = [];
    let duplicates = 0;
    for (let i = 0; i < 2000; i++) {
      const envelope = job(`c-${i % 97}`);
      const delivery = { body: JSON.stringify(envelope), deliveryCount: 1 };
      deliveries.push(delivery);
      if (i % 7 === 0) failFirst.add(envelope.job_id);
      else if (i % 5 === 0) {
        // Copies next to each other in the queue run at the same time.
        deliveries.push(delivery, delivery);
        duplicates += 2;
      }
    }
    const results = await deliverAll(bound, deliveries, 32);

    expect(outcomes(results)).toEqual({ success: 2000, duplicate: duplicates, retry: failFirst.size });
    expect(await ledger(name)).toEqual({ fences: 2000, effects: 2000, jobs: 2000, orphanFences: 0, notOne: 0 });
    const [retried] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from test_effects where consumer = ${name} and amount = 2`;
    expect(retried?.n).toBe(failFirst.size); // the failed first attempts' inserts were rolled back
    expect(backends.size).toBeLessThanOrEqual(POOL_SIZE); // 32 clients really shared PgBouncer's few servers
  });

  test("16 concurrent deliveries of one job through the pooler give one effect and 15 duplicates (#8 item 13)", async () => {
    let runs = 0;
    let name = "";
    const c = consumer(async (_data, { tx, envelope }) => {
      runs += 1;
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: 1 });
      // Holds the fence uncommitted while the other copies reach their fence insert.
      await tx.execute(dsql`select pg_sleep(0.1)`);
    });
    name = c.name;
    const bound = bindConsumer(c, { db: connectPooled(16), logger: silentLogger });
    const body = JSON.stringify(job());
    const results = await Promise.all(Array.from({ length: 16 }, () => bound.deliver({ body, deliveryCount: 1 })));

    expect(outcomes(results)).toEqual({ success: 1, duplicate: 15 });
    expect(runs).toBe(1);
    expect(await ledger(name)).toEqual({ fences: 1, effects: 1, jobs: 1, orphanFences: 0, notOne: 0 });
  });

  test("the ordering key still runs one job per key at a time through the pooler (#8 item 13)", async () => {
    let running = 0;
    let maxRunning = 0;
    let name = "";
    const c = consumer(
      async (_data, { tx, envelope }) => {
        running += 1;
        maxRunning = Math.max(maxRunning, running);
        await tx.execute(dsql`select pg_sleep(0.03)`);
        running -= 1;
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: 1 });
      },
      { orderingKey: (data) => data.customerId },
    );
    name = c.name;
    const bound = bindConsumer(c, { db: connectPooled(12), logger: silentLogger });

    const same = Array.from({ length: 8 }, () => ({ body: JSON.stringify(job("c-same")), deliveryCount: 1 }));
    expect(outcomes(await deliverAll(bound, same, 8))).toEqual({ success: 8 });
    expect(maxRunning).toBe(1);

    maxRunning = 0;
    const distinct = Array.from({ length: 8 }, (_, i) => ({ body: JSON.stringify(job(`c-${i}`)), deliveryCount: 1 }));
    expect(outcomes(await deliverAll(bound, distinct, 8))).toEqual({ success: 8 });
    expect(maxRunning).toBeGreaterThan(1); // the lock is per key, not global
    expect(await ledger(name)).toEqual({ fences: 16, effects: 16, jobs: 16, orphanFences: 0, notOne: 0 });
  });

  describe("pipelining, seen on the wire by a proxy between postgres.js and PgBouncer", () => {
    let proxy: WireProxy;
    beforeAll(async () => {
      proxy = await startWireProxy(bouncer.url(pg.name));
    });
    afterAll(async () => {
      await proxy?.close();
    });

    /** Delivers 200 jobs (some failing once, some duplicated) 8 at a time through the proxy; returns what it saw. */
    async function run(pipeline: boolean | undefined, client: ClientOptions = {}) {
      proxy.reset();
      const failFirst = new Set<string>();
      let name = "";
      const c = consumer(async (_data, { tx, envelope, attempt }) => {
        await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: attempt });
        if (attempt === 1 && failFirst.has(envelope.job_id)) throw new Error("provider down");
      });
      name = c.name;
      const deps: HarnessDeps = {
        db: connectVia(8, proxy.url(pg.name), client),
        logger: silentLogger,
        ...(pipeline === undefined ? {} : { pipeline }),
      };
      const deliveries: Delivery[] = [];
      for (let i = 0; i < 200; i++) {
        const envelope = job(`c-${i}`);
        const delivery = { body: JSON.stringify(envelope), deliveryCount: 1 };
        deliveries.push(delivery);
        if (i % 10 === 0) failFirst.add(envelope.job_id);
        else if (i % 10 === 5) deliveries.push(delivery);
      }
      const results = await deliverAll(bindConsumer(c, deps), deliveries, 8);
      expect(outcomes(results)).toEqual({ success: 200, duplicate: 20, retry: 20 });
      expect(await ledger(name)).toEqual({ fences: 200, effects: 200, jobs: 200, orphanFences: 0, notOne: 0 });
      return proxy.seen();
    }

    test("by default the harness pipelines BEGIN with the fence, and the proxy sees it (#8 item 13)", async () => {
      const seen = await run(undefined);
      expect(seen.queries).toBeGreaterThan(0);
      expect(seen.pipelined).toBeGreaterThan(0);
    });

    test("with pipeline: false the harness sends one statement at a time and every job still has exactly one effect (#8 item 13)", async () => {
      const seen = await run(false);
      expect(seen.queries).toBeGreaterThan(0);
      expect({ pipelined: seen.pipelined, examples: seen.examples }).toEqual({ pipelined: 0, examples: [] });
    });

    test("a postgres.js client with max_pipeline: 0 sends nothing pipelined, the harness's BEGIN and fence included (#8 item 13)", async () => {
      // The client-level switch (porsager/postgres #970's workaround): it also
      // covers what the pool sends outside the work transaction.
      const seen = await run(undefined, { max_pipeline: 0 });
      expect(seen.queries).toBeGreaterThan(0);
      expect({ pipelined: seen.pipelined, examples: seen.examples }).toEqual({ pipelined: 0, examples: [] });
    });
  });
});

interface WireProxy {
  url(database: string): string;
  /** Query messages seen, and how many were sent while an earlier query on the connection still awaited ReadyForQuery. */
  seen(): { queries: number; pipelined: number; examples: string[] };
  reset(): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy on 127.0.0.1 that reads the frontend/backend protocol just
 * enough (1-byte type, 4-byte length) to see pipelining: per connection, each
 * Query ('Q') or extended-protocol Sync ('S') awaits one ReadyForQuery ('Z');
 * a query-bearing message (Q, Parse, Bind, Execute) sent while one is still
 * awaited is pipelined. The backend's bytes are read before they are passed
 * on, so a message the client sends after seeing 'Z' is never miscounted.
 */
async function startWireProxy(target: string): Promise<WireProxy> {
  const targetUrl = new URL(target);
  let queries = 0;
  let pipelined = 0;
  let examples: string[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect(Number(targetUrl.port), targetUrl.hostname);
    sockets.add(client).add(upstream);
    let awaiting = 0;
    let started = false; // the first client message (StartupMessage) has no type byte
    let fromClient = Buffer.alloc(0);
    let fromServer = Buffer.alloc(0);

    client.on("data", (chunk: Buffer) => {
      fromClient = Buffer.concat([fromClient, chunk]);
      for (;;) {
        if (!started) {
          if (fromClient.length < 4) break;
          const length = fromClient.readInt32BE(0);
          if (fromClient.length < length) break;
          fromClient = fromClient.subarray(length);
          started = true;
          continue;
        }
        if (fromClient.length < 5) break;
        const length = fromClient.readInt32BE(1);
        if (fromClient.length < 1 + length) break;
        const type = String.fromCharCode(fromClient[0] ?? 0);
        const body = fromClient.subarray(5, 1 + length);
        fromClient = fromClient.subarray(1 + length);
        if (type === "Q" || type === "P" || type === "B" || type === "E") {
          if (type === "Q" || type === "P") queries += 1;
          if (awaiting > 0) {
            pipelined += 1;
            if (examples.length < 5) examples.push(`${type} ${statementText(type, body)}`);
          }
        }
        if (type === "Q" || type === "S") awaiting += 1;
      }
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      fromServer = Buffer.concat([fromServer, chunk]);
      while (fromServer.length >= 5) {
        const length = fromServer.readInt32BE(1);
        if (fromServer.length < 1 + length) break;
        // The first 'Z' (after authentication) answers no query.
        if (fromServer[0] === 0x5a) awaiting = Math.max(0, awaiting - 1);
        fromServer = fromServer.subarray(1 + length);
      }
      client.write(chunk);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    for (const s of [client, upstream]) {
      s.on("error", close);
      s.on("close", close);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return {
    url(database) {
      const url = new URL(target);
      url.port = String(port);
      url.pathname = `/${encodeURIComponent(database)}`;
      return url.toString();
    },
    seen: () => ({ queries, pipelined, examples }),
    reset() {
      queries = 0;
      pipelined = 0;
      examples = [];
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** The statement text of a Query or Parse message, shortened, for the failure message. */
function statementText(type: string, body: Buffer): string {
  const text = type === "Q" ? body : type === "P" ? body.subarray(body.indexOf(0) + 1) : undefined;
  if (!text) return "";
  return text
    .subarray(0, Math.max(0, text.indexOf(0)))
    .toString("utf8")
    .slice(0, 60);
}
