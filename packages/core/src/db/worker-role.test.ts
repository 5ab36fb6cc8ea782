/**
 * The shipped worker role (migration 0018_ops_roles, #21 item 3): a consumer
 * whose login is only a member of softcrum_worker (and of its module's
 * tables) runs every outcome of the harness — success, duplicate, a new dead
 * letter and a repeated one — and may not touch what belongs to operators:
 * a letter's status, batches, the audit.
 */
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "../consumer.ts";
import { createEnvelope } from "../envelope.ts";
import { PermanentError } from "../errors.ts";
import type { AnyPgDatabase } from "./types.ts";

const pg = useEffectsDatabase("worker-role");
// Login roles are cluster-wide: one of its own per run, dropped afterwards.
const WORKER = `sc_worker_${Math.random().toString(36).slice(2, 10)}`;
let client: postgres.Sql;
let db: AnyPgDatabase;

beforeAll(async () => {
  await pg.sql.unsafe(`create role ${WORKER} login in role softcrum_worker`);
  // The module's own table, as a module's migration grants it (apps/loyalty/drizzle/0003_loyalty_worker_grants.sql).
  await pg.sql.unsafe(`grant select, insert on test_effects to softcrum_worker`);
  const url = new URL(pg.url);
  url.username = WORKER;
  client = postgres(url.toString(), { max: 2, onnotice: () => {} });
  db = drizzle({ client }) as unknown as AnyPgDatabase;
});

afterAll(async () => {
  await client?.end({ timeout: 2 });
  await pg.sql.unsafe(`drop role if exists ${WORKER}`);
});

const consumer = defineConsumer({
  name: "worker-role.award",
  queue: "worker-role.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number().int() }),
  async handle(data, { tx, envelope }) {
    if (data.points < 0) throw new PermanentError("negative points");
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "worker-role.award", amount: data.points });
  },
});

const award = (points: number) =>
  JSON.stringify(createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points } }));

describe("a consumer logged in as the shipped worker role", () => {
  test("runs success, duplicate, a dead letter and its repeat", async () => {
    const bound = bindConsumer(consumer, { db, logger: silentLogger });
    const body = award(5);
    expect((await bound.deliver({ body, deliveryCount: 1 })).outcome).toBe("success");
    expect((await bound.deliver({ body, deliveryCount: 2 })).outcome).toBe("duplicate");
    const bad = award(-1);
    expect((await bound.deliver({ body: bad, deliveryCount: 1 })).outcome).toBe("dead_lettered");
    expect((await bound.deliver({ body: bad, deliveryCount: 2 })).outcome).toBe("dead_lettered");
    const poison = "{not json";
    expect((await bound.deliver({ body: poison, deliveryCount: 1 })).outcome).toBe("poison");
    expect((await bound.deliver({ body: poison, deliveryCount: 2 })).outcome).toBe("poison");
    const letters = await pg.sql<{ error_class: string; occurrences: number; status: string }[]>`
      select error_class, occurrences, status from core.dead_letters order by error_class`;
    expect(letters).toEqual([
      // The second delivery finds the job's letter pending and writes nothing more.
      { error_class: "permanent", occurrences: 1, status: "pending_review" },
      // The same poison body again counts a repeat on its letter (the worker's column UPDATE).
      { error_class: "poison", occurrences: 2, status: "pending_review" },
    ]);
    expect((await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`)[0]?.n).toBe(1);
  });

  test("may not change a letter's status, a batch or the audit", async () => {
    const refused = (statement: Promise<unknown>) =>
      statement.then(
        () => "allowed",
        (error: { code?: string }) => error.code,
      );
    expect(await refused(client`update core.dead_letters set status = 'discarded', status_changed_by = 'x'`)).toBe(
      "42501",
    );
    expect(await refused(client`select 1 from core.replay_batches`)).toBe("42501");
    expect(await refused(client`select 1 from core.ops_audit`)).toBe("42501");
    expect(await refused(client`select core.ops_discard_letters(array[]::uuid[], null, 'x')`)).toBe("42501");
  });
});
