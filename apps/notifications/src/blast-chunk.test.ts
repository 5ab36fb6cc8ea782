import { createEnvelope } from "@softcrum/core";
import { useModuleDatabase } from "@softcrum/core/testing";
import { uuidv7 } from "uuidv7";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { wireError } from "../test/fake-resend-wire.ts";
import { message, outcomesOf, seedContacts, startTestModule, type TestModule } from "../test/harness.ts";
import { blastChunkIdempotencyKey } from "./blast-chunk.ts";
import { BLAST_CHUNK_KIND, blastChunkJobId } from "./chunk-job-id.ts";
import { addContacts } from "./contacts.ts";
import { EMAIL_MARKETING_QUEUE } from "./email-lanes.ts";

const pg = useModuleDatabase("notifications-chunk");
const CHUNK = "notifications.blast-chunk";
let t: TestModule;

beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters, notifications.contacts, notifications.blasts,
    notifications.blast_recipients, notifications.blast_chunk_sends, notifications.email_sends cascade`;
  t = await startTestModule(pg);
});
afterEach(async () => {
  await t.close();
});

const letters = () =>
  pg.sql<{ consumer: string; error_class: string; attempts: number; last_error: string }[]>`
    select consumer, error_class, attempts, last_error from core.dead_letters order by created_at`;

/** The original addresses `c-00000@example.com` … that each got exactly one e-mail. */
function expectOneEmailEach(n: number) {
  const per = t.fake.emailsPerRecipient();
  const expected = Array.from({ length: n }, (_, i) => `c-${String(i).padStart(5, "0")}@example.com`);
  expect([...per.keys()].sort()).toEqual(expected);
  expect([...per.values()].every((count) => count === 1)).toBe(true);
}

/** Makes the first COMMIT of a chunk fail after its work ran (a deferred trigger), as a crash or failover would. */
async function failFirstChunkCommit() {
  await pg.sql.unsafe(`
    create sequence notifications.test_commit_failures;
    create function notifications.test_refuse_first_commit() returns trigger language plpgsql as $$
    begin
      -- nextval is not rolled back with the transaction it fails: only the first commit is refused.
      if nextval('notifications.test_commit_failures') = 1 then
        raise exception 'commit refused (test)';
      end if;
      return null;
    end $$;
    create constraint trigger test_refuse_first_commit after insert on notifications.blast_chunk_sends
      deferrable initially deferred for each row execute function notifications.test_refuse_first_commit();`);
  return () =>
    pg.sql.unsafe(`
      drop trigger test_refuse_first_commit on notifications.blast_chunk_sends;
      drop function notifications.test_refuse_first_commit();
      drop sequence notifications.test_commit_failures;`);
}

describe("blast chunks through the real Resend SDK", () => {
  test("1,050 recipients, every chunk delivered twice, some calls 429: 11 accepted batch calls, one e-mail each (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 1_050);
    t.fake.rateLimitNext(4, 2);
    const blastId = uuidv7();
    const input = { blastId, tenantId: "acme", message };
    // Started twice at once: 22 chunk jobs on the lane, two of each job_id.
    const reports = await Promise.all([t.module.startBlast(input), t.module.startBlast(input)]);
    expect(reports.map((r) => [r.recipients, r.chunks, r.published])).toEqual([
      [1_050, 11, 11],
      [1_050, 11, 11],
    ]);
    await t.module.settle();

    expect(t.fake.count("accepted", "/emails/batch")).toBe(11);
    expect(t.fake.count("rate_limited", "/emails/batch")).toBe(4);
    expect(t.fake.count("replayed")).toBe(0);
    expect(t.fake.requests.filter((r) => r.path === "/emails")).toEqual([]);
    expectOneEmailEach(1_050);
    const keys = t.fake.requests.filter((r) => r.outcome === "accepted").map((r) => r.idempotencyKey);
    expect(new Set(keys)).toEqual(
      new Set(Array.from({ length: 11 }, (_, c) => blastChunkIdempotencyKey(blastChunkJobId(blastId, c)))),
    );

    const outcomes = outcomesOf(t.deliveries, CHUNK);
    expect(outcomes.filter((o) => o === "success")).toHaveLength(11);
    expect(outcomes.filter((o) => o === "duplicate")).toHaveLength(11);
    expect(outcomes.filter((o) => o === "rate_limited").length).toBeGreaterThanOrEqual(4);
    expect(outcomes.filter((o) => !["success", "duplicate", "rate_limited", "yielded"].includes(o))).toEqual([]);
    // A 429 spends no attempt: no delivery of any chunk was ever counted as a second one.
    expect(Math.max(...t.deliveries.map((d) => d.deliveryCount))).toBe(1);
    expect(await letters()).toEqual([]);

    const [sent] = await pg.sql<{ chunks: number; recipients: number; with_ids: number }[]>`
      select (select count(*)::int from notifications.blast_chunk_sends) as chunks,
             (select coalesce(sum(recipients), 0)::int from notifications.blast_chunk_sends) as recipients,
             (select count(*)::int from notifications.blast_recipients where provider_email_id is not null) as with_ids`;
    expect(sent).toEqual({ chunks: 11, recipients: 1_050, with_ids: 1_050 });
    const ids = await pg.sql<{ email: string; provider_email_id: string }[]>`
      select email, provider_email_id from notifications.blast_recipients where blast_id = ${blastId}`;
    const fakeIds = new Map(t.fake.emails.map((e) => [e.to[0], e.id]));
    expect(ids.every((r) => fakeIds.get(r.email) === r.provider_email_id)).toBe(true);
  });

  test("a 429 storm longer than the retry budget defers without spending attempts and never dead-letters", async () => {
    await seedContacts(pg, "acme", 40);
    t.fake.rateLimitNext(8, 30);
    await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.settle();
    expect(t.fake.count("rate_limited")).toBe(8);
    expect(t.fake.count("accepted")).toBe(1);
    expect(outcomesOf(t.deliveries, CHUNK).filter((o) => o === "success")).toHaveLength(1);
    expect(Math.max(...t.deliveries.map((d) => d.deliveryCount))).toBe(1);
    expect(await letters()).toEqual([]);
    expectOneEmailEach(40);
  });

  test("a chunk whose COMMIT fails after Resend accepted it is retried, and Resend de-duplicates it by key: one e-mail each", async () => {
    await seedContacts(pg, "acme", 80);
    const restore = await failFirstChunkCommit();
    try {
      const blastId = uuidv7();
      await t.module.startBlast({ blastId, tenantId: "acme", message });
      await t.module.settle();
      expect(outcomesOf(t.deliveries, CHUNK).filter((o) => o !== "rate_limited")).toEqual(["retry", "success"]);
      const batch = t.fake.requests.filter((r) => r.path === "/emails/batch");
      expect(batch.map((r) => r.outcome)).toEqual(["accepted", "replayed"]);
      expect(new Set(batch.map((r) => r.idempotencyKey))).toEqual(
        new Set([blastChunkIdempotencyKey(blastChunkJobId(blastId, 0))]),
      );
      expectOneEmailEach(80);
      const sends = await pg.sql<{ attempt: number }[]>`select attempt from notifications.blast_chunk_sends`;
      expect(sends).toEqual([{ attempt: 2 }]);
    } finally {
      await restore();
    }
  });

  test("contacts added, deleted or unsubscribed after the blast started change no chunk, even across a retry (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 150);
    const restore = await failFirstChunkCommit();
    try {
      let changed = false;
      // While the first chunk is at Resend: the store changes under it, before its retry and before chunk 1.
      t.fake.beforeAccept(async () => {
        if (changed) return;
        changed = true;
        await seedContacts(pg, "acme", 30, "late");
        await pg.sql`delete from notifications.contacts where email in ('c-00001@example.com', 'c-00120@example.com')`;
        await pg.sql`update notifications.contacts set unsubscribed_at = now() where email = 'c-00002@example.com'`;
      });
      await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
      await t.module.settle();
      expect(changed).toBe(true);
      const batch = t.fake.requests.filter((r) => r.path === "/emails/batch");
      // The retry of the refused commit sent the very same request: a replay, never a 409 for another payload.
      expect(batch.map((r) => r.outcome).sort()).toEqual(["accepted", "accepted", "replayed"]);
      const first = batch.filter((r) => r.idempotencyKey === batch[0]?.idempotencyKey);
      expect(first).toHaveLength(2);
      expect(first[1]?.body).toEqual(first[0]?.body);
      expectOneEmailEach(150);
    } finally {
      await restore();
    }
  });

  test("a chunk payload that fails the schema is dead-lettered as poison with zero retries, and nothing is sent", async () => {
    const bad = createEnvelope({
      jobId: blastChunkJobId(uuidv7(), 0),
      tenantId: "acme",
      kind: BLAST_CHUNK_KIND,
      data: { blastId: "not-a-uuid", chunk: -1, firstPosition: 0, count: 101 },
    });
    await t.module.queue.publish(EMAIL_MARKETING_QUEUE, bad);
    await t.module.settle();
    expect(outcomesOf(t.deliveries, CHUNK)).toEqual(["poison"]);
    const [letter] = await letters();
    expect(letter).toMatchObject({ consumer: CHUNK, error_class: "poison", attempts: 0 });
    expect(letter?.last_error).toMatch(/blastId/);
    expect(t.fake.requests).toEqual([]);
  });

  test("a chunk of a blast we do not have, or of another tenant's, is dead-lettered as permanent without calling Resend", async () => {
    await seedContacts(pg, "acme", 3);
    const blastId = uuidv7();
    await t.module.startBlast({ blastId, tenantId: "acme", message });
    await t.module.settle();
    const requestsBefore = t.fake.requests.length;
    const chunk = (tenantId: string, id: string) =>
      createEnvelope({
        jobId: uuidv7(),
        tenantId,
        kind: BLAST_CHUNK_KIND,
        data: { blastId: id, chunk: 0, firstPosition: 0, count: 3 },
      });
    await t.module.queue.publish(EMAIL_MARKETING_QUEUE, chunk("acme", uuidv7()));
    await t.module.queue.publish(EMAIL_MARKETING_QUEUE, chunk("intruder", blastId));
    await t.module.settle();
    const found = await letters();
    expect(found.map((l) => [l.error_class, l.attempts])).toEqual([
      ["permanent", 1],
      ["permanent", 1],
    ]);
    expect(found.map((l) => l.last_error)).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^PermanentError: blast .* does not exist$/),
        expect.stringMatching(/^PermanentError: blast .* is not tenant intruder's$/),
      ]),
    );
    expect(t.fake.requests.length).toBe(requestsBefore);
  });

  test("Resend's 422 validation error dead-letters the chunk at once (permanent); a 500 is retried and then sent once", async () => {
    await seedContacts(pg, "acme", 30);
    t.fake.failNext(1, wireError(422, "validation_error", "Invalid `to` field."));
    await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.settle();
    const [letter] = await letters();
    expect(letter).toMatchObject({ consumer: CHUNK, error_class: "permanent", attempts: 1 });
    expect(letter?.last_error).toMatch(/422 validation_error/);
    expect(t.fake.emails).toEqual([]);

    t.fake.failNext(1, wireError(500, "internal_server_error", "Something went wrong."));
    await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.settle();
    expect(outcomesOf(t.deliveries, CHUNK).filter((o) => o !== "rate_limited")).toEqual([
      "dead_lettered",
      "retry",
      "success",
    ]);
    expect(await letters()).toHaveLength(1);
    expectOneEmailEach(30);
  });
});

test("addContacts lowercases addresses: one person is one contact", async () => {
  await addContacts(pg.db, "acme", [{ email: "Ann@Example.com" }, { email: "ann@example.com", name: "Ann" }]);
  const rows = await pg.sql`select email, name from notifications.contacts`;
  expect(rows).toEqual([{ email: "ann@example.com", name: "Ann" }]);
});
