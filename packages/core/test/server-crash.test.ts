// A server crash right after the harness acknowledged: on a cluster whose
// synchronous_commit is off (and whose WAL writer sleeps 10 s), every job
// acknowledged as done keeps its fence and its effect, and every letter
// acknowledged keeps its row, whatever the handler set for its own
// transaction (SET CONSTRAINTS ALL IMMEDIATE, then synchronous_commit off,
// then a search_path whose current_setting() says on):
// single jobs, a batch, a dead letter decided under the fence key and a
// poison letter written on the pool. A COMMIT that answered before its WAL
// left the server's memory would be lost by `pg_ctl stop -m immediate`; the
// transport has already deleted the message, so the job would be gone
// without a trace. Runs on a throwaway cluster, never on the shared server.
import { startThrowawayPostgres, type ThrowawayPostgres } from "@softcrum/testing";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, expect, test } from "vitest";
import { bindConsumer } from "../src/consumer.ts";
import { migrateCore } from "../src/db/migrate.ts";
import { PermanentError } from "../src/errors.ts";
import { job, jobs, together } from "./batches.ts";
import { createEffectsTable, effects, silentLogger, testConsumers } from "./fixtures.ts";

let pg: ThrowawayPostgres | undefined;

beforeAll(async () => {
  pg = await startThrowawayPostgres({
    migrate: migrateCore,
    // The cluster's default is off (the throwaway clusters' own), and the WAL
    // writer flushes only every 10 s: an asynchronous commit's WAL stays in
    // shared memory, which the crash loses.
    settings: { synchronous_commit: "off", wal_writer_delay: "'10s'" },
  });
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  await createEffectsTable(admin);
  // A current_setting() a handler's search_path can put ahead of pg_catalog's.
  await admin.unsafe(`create schema crash_shadow;
    create function crash_shadow.current_setting(text) returns text language sql as $$ select 'on'::text $$`);
  // An application table whose deferred trigger turns synchronous_commit off:
  // it runs inside COMMIT, after anything the engine sends before it.
  await admin.unsafe(`create table crash_audit (job_id uuid);
    create function crash_audit_async() returns trigger language plpgsql as $$
      begin perform pg_catalog.set_config('synchronous_commit', 'off', true); return null; end $$;
    create constraint trigger crash_audit_async after insert on crash_audit
      deferrable initially deferred for each row execute function crash_audit_async()`);
  await admin.end();
}, 60_000);

afterAll(async () => {
  await pg?.stop();
});

const consumer = testConsumers("crash");

test("a crash right after the acknowledgements loses no acknowledged fence, effect or letter, whatever the handler set", async () => {
  if (!pg) throw new Error("the throwaway cluster did not start");
  const client = postgres(pg.url, { max: 4, onnotice: () => {} });
  const db = drizzle({ client });
  const handle: Parameters<typeof consumer>[0] = async (data, { tx, envelope }) => {
    // What a handler (or a function it calls) may do to its own transaction:
    // fire the deferred triggers now (core's durable one among them), then
    // turn synchronous_commit off for the rest of it.
    await tx.execute(sql`set constraints all immediate`);
    await tx.execute(sql`set local synchronous_commit = off`);
    await tx.execute(sql`set local search_path = crash_shadow, pg_catalog, public`);
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
    if (data.n === 99) throw new PermanentError("rejected");
  };
  const single = bindConsumer(consumer(handle), { db, logger: silentLogger });
  const batched = bindConsumer(consumer(handle, { batch: { maxSize: 4, maxWaitMs: 30 } }), {
    db,
    logger: silentLogger,
  });
  try {
    // The letters first: a later COMMIT that flushes the WAL also flushes
    // every earlier one, so the jobs go last.
    expect((await single.deliver({ body: JSON.stringify(job(99)), deliveryCount: 1 })).outcome).toBe("dead_lettered");
    expect((await single.deliver({ body: "not json", deliveryCount: 1 })).outcome).toBe("poison");
    for (const e of jobs(5, 1)) {
      expect((await single.deliver({ body: JSON.stringify(e), deliveryCount: 1 })).outcome).toBe("success");
    }
    expect((await together(batched, jobs(4, 10))).map((r) => r.outcome)).toEqual(Array(4).fill("success"));
  } finally {
    await client.end({ timeout: 1 });
  }

  await pg.shutdown({ mode: "immediate" });
  await pg.start();

  const after = postgres(pg.url, { max: 1, onnotice: () => {} });
  try {
    const [row] = await after<{ effects: number; fences: number; letters: number }[]>`
      select (select count(*)::int from test_effects) as effects,
             (select count(*)::int from core.processed_jobs) as fences,
             (select count(*)::int from core.dead_letters where status = 'pending_review') as letters`;
    expect(row).toEqual({ effects: 9, fences: 9, letters: 2 });
  } finally {
    await after.end({ timeout: 1 });
  }
});

test("code that runs inside COMMIT (an application table's deferred trigger, a WITH HOLD cursor's query) cannot turn the durable commit off: a crash loses no acknowledged job", async () => {
  if (!pg) throw new Error("the throwaway cluster did not start");
  const client = postgres(pg.url, { max: 4, onnotice: () => {} });
  const db = drizzle({ client });
  const counted = async () => {
    const sql = postgres(pg?.url ?? "", { max: 1, onnotice: () => {} });
    try {
      const [row] = await sql<
        { effects: number }[]
      >`select count(*)::int as effects from test_effects where consumer = 'inside'`;
      return row?.effects ?? -1;
    } finally {
      await sql.end({ timeout: 1 });
    }
  };
  const handle: Parameters<typeof consumer>[0] = async (data, { tx, envelope }) => {
    if (data.n % 2 === 0) {
      await tx.execute(
        sql.raw(`declare crash_hold_${data.n} cursor with hold for
        select pg_catalog.set_config('synchronous_commit', 'off', true)`),
      );
    } else {
      await tx.execute(sql`insert into crash_audit (job_id) values (${envelope.job_id})`);
    }
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "inside", amount: data.n });
  };
  const single = bindConsumer(consumer(handle), { db, logger: silentLogger });
  const batched = bindConsumer(consumer(handle, { batch: { maxSize: 4, maxWaitMs: 30 } }), {
    db,
    logger: silentLogger,
  });
  try {
    for (const e of jobs(4, 30)) {
      expect((await single.deliver({ body: JSON.stringify(e), deliveryCount: 1 })).outcome).toBe("success");
    }
    expect((await together(batched, jobs(4, 40))).map((r) => r.outcome)).toEqual(Array(4).fill("success"));
  } finally {
    await client.end({ timeout: 1 });
  }
  expect(await counted()).toBe(8);

  await pg.shutdown({ mode: "immediate" });
  await pg.start();
  expect(await counted()).toBe(8);
});

test("letters alone: a crash right after a dead letter and a poison letter are acknowledged loses neither", async () => {
  // Nothing after the letters flushes the WAL for them (the first test's jobs
  // did): each is written outside a work transaction (the decision under the
  // fence key, the poison letter on the pool), so only the dead letters'
  // deferred trigger makes their COMMIT wait for the flush.
  if (!pg) throw new Error("the throwaway cluster did not start");
  const client = postgres(pg.url, { max: 4, onnotice: () => {} });
  const db = drizzle({ client });
  const single = bindConsumer(
    consumer(async (data) => {
      if (data.n === 98) throw new PermanentError("rejected");
    }),
    { db, logger: silentLogger },
  );
  const count = async (url: string) => {
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    try {
      const [row] = await sql<{ letters: number }[]>`select count(*)::int as letters from core.dead_letters`;
      return row?.letters;
    } finally {
      await sql.end({ timeout: 1 });
    }
  };
  const before = await count(pg.url);
  try {
    expect((await single.deliver({ body: JSON.stringify(job(98)), deliveryCount: 1 })).outcome).toBe("dead_lettered");
    expect((await single.deliver({ body: "still not json", deliveryCount: 1 })).outcome).toBe("poison");
  } finally {
    await client.end({ timeout: 1 });
  }

  await pg.shutdown({ mode: "immediate" });
  await pg.start();
  expect(await count(pg.url)).toBe((before ?? 0) + 2);
});
