/**
 * #18 item 6: a deploy never stalls live work. A migration statement that
 * needs a lock live work transactions hold (ALTER TABLE core.processed_jobs …,
 * ACCESS EXCLUSIVE; every work transaction holds its fence row) waits at most
 * `lockTimeoutMs`, then the file is rolled back and tried again: meanwhile
 * new jobs keep committing. And a work transaction holds no lock on
 * core.dead_letters at all (its pending-letter check reads
 * core.pending_letter_keys), so the letters' table can change while the
 * longest job runs. Real Postgres, a real long job in flight.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { latch } from "../../test/latch.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { migratePostgres } from "./migrate.ts";

const pg = useEffectsDatabase("migrate_locks");
const folders: string[] = [];
afterAll(() => {
  for (const folder of folders) rmSync(folder, { recursive: true, force: true });
});

/** A migration set of one file: the kind of statement migration 0009 had, on `table`. */
function alterSet(name: string, table: "dead_letters" | "processed_jobs") {
  const folder = mkdtempSync(join(tmpdir(), "softcrum-lock-migrations-"));
  folders.push(folder);
  mkdirSync(join(folder, "meta"));
  writeFileSync(
    join(folder, `${name}.sql`),
    `ALTER TABLE "core"."${table}" ADD CONSTRAINT "${name}" CHECK (consumer <> '') NOT VALID;`,
  );
  writeFileSync(join(folder, "meta", "_journal.json"), JSON.stringify({ entries: [{ tag: name, when: 1 }] }));
  return { migrationsFolder: folder, migrationsSchema: "drizzle", migrationsTable: `__lock_test_${name}` };
}

/** A consumer whose job `n === 0` holds its work transaction open until released; the others commit at once. */
function liveAndLong() {
  const held = latch();
  const running = latch();
  const definition = defineConsumer({
    name: `locks.c-${Math.random().toString(36).slice(2)}`,
    queue: "locks.q",
    kind: "test.v1",
    schema: z.object({ n: z.number().int() }),
    timeoutMs: 20_000,
    async handle(data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "c", amount: data.n });
      if (data.n === 0) {
        running.open();
        await held.opened;
      }
    },
  });
  const bound = bindConsumer(definition, { db: pg.connect({ max: 8 }).db, logger: silentLogger });
  const deliver = (n: number) =>
    bound.deliver({
      body: JSON.stringify(createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } })),
      deliveryCount: 1,
    });
  return { deliver, release: held.open, running: running.opened };
}

async function migrationWaitsOnALock() {
  for (let i = 0; i < 500; i++) {
    const [row] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and query like 'ALTER TABLE%'`;
    if ((row?.n ?? 0) > 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("the migration never waited on a lock");
}

describe("a deploy never stalls live work (#18 item 6)", () => {
  test("while a long job holds a lock on core.processed_jobs (its fence), an ALTER of it gives way to live jobs, and applies once the long job ends", async () => {
    const { deliver, release, running } = liveAndLong();
    const long = deliver(0);
    await running;
    const migrating = migratePostgres(pg.url, alterSet("lock_test_a", "processed_jobs"), {
      lockTimeoutMs: 200,
      lockRetryBaseMs: 50,
    });
    await migrationWaitsOnALock();
    // Live jobs delivered while the migration is trying: every one commits before the long job ends.
    const live = await Promise.all([1, 2, 3, 4, 5, 6].map((n) => deliver(n)));
    expect(live.map((r) => r.outcome)).toEqual(["success", "success", "success", "success", "success", "success"]);
    release();
    expect(await long).toMatchObject({ outcome: "success" });
    expect(await migrating).toEqual({ applied: ["lock_test_a"] });
    const [check] = await pg.sql`select convalidated from pg_constraint where conname = 'lock_test_a'`;
    expect(check).toEqual({ convalidated: false });
  });

  test("a long job in flight holds no lock on core.dead_letters: an ALTER of it applies while the job runs, and the job still commits (#18 item 6)", async () => {
    const { deliver, release, running } = liveAndLong();
    const long = deliver(0);
    await running;
    try {
      const held = await pg.sql<{ mode: string }[]>`
        select l.mode from pg_locks l join pg_stat_activity a on a.pid = l.pid
        where l.relation = 'core.dead_letters'::regclass and a.datname = current_database() and a.state like 'idle in transaction%'`;
      expect(held).toEqual([]);
      expect(
        await migratePostgres(pg.url, alterSet("lock_test_c", "dead_letters"), { lockTimeoutMs: 200, lockRetries: 5 }),
      ).toEqual({ applied: ["lock_test_c"] });
    } finally {
      release();
    }
    expect(await long).toMatchObject({ outcome: "success" });
  });

  test("when the lock never comes free within its retries, the run fails with an error that says why, and applies nothing", async () => {
    const { deliver, release, running } = liveAndLong();
    const long = deliver(0);
    await running;
    try {
      await expect(
        migratePostgres(pg.url, alterSet("lock_test_b", "processed_jobs"), {
          lockTimeoutMs: 100,
          lockRetries: 2,
          lockRetryBaseMs: 20,
        }),
      ).rejects.toThrow(/migration lock_test_b failed: .*lock timeout.*not free within 100 ms in 3 tries/);
    } finally {
      release();
    }
    expect(await long).toMatchObject({ outcome: "success" });
    expect(await pg.sql`select 1 from pg_constraint where conname = 'lock_test_b'`).toHaveLength(0);
  });
});
