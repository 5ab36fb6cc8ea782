import { useModuleDatabase } from "@softcrum/core/testing";
import { uuidv7 } from "uuidv7";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { message, quietLogger, seedContacts, startTestModule, type TestModule } from "../test/harness.ts";
import { startBlast } from "./blast.ts";
import { blastChunkJobId } from "./chunk-job-id.ts";
import { unsubscribeContact } from "./contacts.ts";
import { EMAIL_MARKETING_QUEUE } from "./email-lanes.ts";
import { isNotificationsError } from "./errors.ts";

const pg = useModuleDatabase("notifications-blast");
let t: TestModule | undefined;

beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters, notifications.contacts, notifications.blasts,
    notifications.blast_recipients, notifications.blast_chunk_sends, notifications.email_sends cascade`;
});
afterEach(async () => {
  await t?.close();
  t = undefined;
});

/** A port that only records what it is given: the blast's jobs without running them. */
function recordingQueue() {
  const published: { queue: string; jobId: string; data: unknown; correlationId: string }[] = [];
  return {
    published,
    port: {
      async publish(queue: string, envelope: { job_id: string; data: unknown; correlation_id: string }) {
        published.push({ queue, jobId: envelope.job_id, data: envelope.data, correlationId: envelope.correlation_id });
        return { messageId: envelope.job_id, stored: true };
      },
      async schedule(): Promise<never> {
        throw new Error("not used");
      },
    },
  };
}

describe("blast chunk job ids", () => {
  test("are UUID v7s derived from (blast id, chunk) with the blast's time, the same on every call", () => {
    const blastId = uuidv7();
    const ids = Array.from({ length: 50 }, (_, chunk) => blastChunkJobId(blastId, chunk));
    expect(new Set(ids).size).toBe(50);
    expect(Array.from({ length: 50 }, (_, chunk) => blastChunkJobId(blastId.toUpperCase(), chunk))).toEqual(ids);
    for (const id of ids) {
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      expect(id.slice(0, 13)).toBe(blastId.slice(0, 13));
    }
    expect(blastChunkJobId(uuidv7(), 0)).not.toBe(ids[0]);
  });

  test("refuse a blast id that is not a UUID v7 and a negative chunk", () => {
    expect(() => blastChunkJobId("3b241101-e2bb-4255-8caf-4136c566a962", 0)).toThrow(/UUID version 7/);
    expect(() => blastChunkJobId(uuidv7(), -1)).toThrow(/non-negative integer/);
  });
});

describe("startBlast", () => {
  test("snapshots the tenant's subscribed contacts and publishes one job per 100 on the marketing lane (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 250);
    await seedContacts(pg, "other", 30, "o");
    await unsubscribeContact(pg.db, "acme", "c-00007@example.com");
    const { port, published } = recordingQueue();
    const blastId = uuidv7();
    const report = await startBlast({ db: pg.db, queue: port }, { blastId, tenantId: "acme", message });
    expect(report).toMatchObject({ blastId, created: true, recipients: 249, chunks: 3, published: 3, failed: 0 });
    expect(published.map((p) => p.queue)).toEqual([
      EMAIL_MARKETING_QUEUE,
      EMAIL_MARKETING_QUEUE,
      EMAIL_MARKETING_QUEUE,
    ]);
    expect(published.map((p) => p.data)).toEqual([
      { blastId, chunk: 0, firstPosition: 0, count: 100 },
      { blastId, chunk: 1, firstPosition: 100, count: 100 },
      { blastId, chunk: 2, firstPosition: 200, count: 49 },
    ]);
    expect(published.map((p) => p.jobId)).toEqual([0, 1, 2].map((c) => blastChunkJobId(blastId, c)));
    expect(published.every((p) => p.correlationId === blastId)).toBe(true);
    const snapshot = await pg.sql<{ position: number; email: string }[]>`
      select position, email from notifications.blast_recipients where blast_id = ${blastId} order by position`;
    expect(snapshot).toHaveLength(249);
    expect(snapshot.map((r) => r.position)).toEqual(Array.from({ length: 249 }, (_, i) => i));
    expect(snapshot.some((r) => r.email === "c-00007@example.com" || r.email.startsWith("o-"))).toBe(false);
  });

  test("started again, keeps its snapshot and publishes the same jobs, whatever the contacts did since (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 150);
    const first = recordingQueue();
    const blastId = uuidv7();
    await startBlast({ db: pg.db, queue: first.port }, { blastId, tenantId: "acme", message });
    await seedContacts(pg, "acme", 100, "late");
    await unsubscribeContact(pg.db, "acme", "c-00000@example.com");
    const second = recordingQueue();
    const report = await startBlast({ db: pg.db, queue: second.port }, { blastId, tenantId: "acme", message });
    expect(report).toMatchObject({ created: false, recipients: 150, chunks: 2, published: 2 });
    expect(second.published).toEqual(first.published);
  });

  test("a tenant with no subscribed contact is an EmptyBlastError, and nothing is written or published", async () => {
    await seedContacts(pg, "acme", 1);
    await unsubscribeContact(pg.db, "acme", "c-00000@example.com");
    const { port, published } = recordingQueue();
    const start = startBlast({ db: pg.db, queue: port }, { blastId: uuidv7(), tenantId: "acme", message });
    await expect(start).rejects.toSatisfy((e) => isNotificationsError(e, "EMPTY_BLAST"));
    expect(published).toEqual([]);
    const blastRows = await pg.sql<{ n: number }[]>`select count(*)::int as n from notifications.blasts`;
    expect(blastRows[0]?.n).toBe(0);
  });

  test("bad input is an InvalidBlastError naming every problem; nothing is written", async () => {
    const { port, published } = recordingQueue();
    const deps = { db: pg.db, queue: port };
    const bad = startBlast(deps, {
      blastId: "not-a-uuid",
      tenantId: "",
      message: { from: "x", subject: "" },
    });
    await expect(bad).rejects.toSatisfy((e) => isNotificationsError(e, "INVALID_BLAST"));
    await expect(bad).rejects.toThrow(/tenantId.*message\.from.*message\.subject.*message\.html: html or text/s);
    await expect(
      startBlast(deps, { blastId: "3b241101-e2bb-4255-8caf-4136c566a962", tenantId: "acme", message }),
    ).rejects.toThrow(/UUID version 7/);
    await expect(
      startBlast(deps, { blastId: uuidv7(), tenantId: "acme", message }, { chunkSize: 101 }),
    ).rejects.toThrow(/chunkSize: must be an integer from 1 to 100/);
    expect(published).toEqual([]);
  });

  test("an id already started with another message or tenant is a BlastConflictError; nothing is published", async () => {
    await seedContacts(pg, "acme", 5);
    await seedContacts(pg, "other", 5);
    const { port, published } = recordingQueue();
    const blastId = uuidv7();
    await startBlast({ db: pg.db, queue: port }, { blastId, tenantId: "acme", message });
    published.length = 0;
    const changed = { ...message, subject: "Another subject" };
    await expect(
      startBlast({ db: pg.db, queue: port }, { blastId, tenantId: "acme", message: changed }),
    ).rejects.toSatisfy((e) => isNotificationsError(e, "BLAST_CONFLICT"));
    await expect(startBlast({ db: pg.db, queue: port }, { blastId, tenantId: "other", message })).rejects.toThrow(
      /different tenant/,
    );
    expect(published).toEqual([]);
  });

  test("a failed publish is reported with its chunk, and starting again publishes the rest (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 300);
    const { port, published } = recordingQueue();
    let refuse = true;
    const flaky = {
      ...port,
      async publish(queue: string, envelope: { job_id: string; data: unknown; correlation_id: string }) {
        if (refuse && (envelope.data as { chunk: number }).chunk === 1) throw new Error("transport down");
        return port.publish(queue, envelope);
      },
    };
    const blastId = uuidv7();
    const first = await startBlast({ db: pg.db, queue: flaky }, { blastId, tenantId: "acme", message });
    expect(first).toMatchObject({
      published: 2,
      failed: 1,
      failures: [{ chunk: 1, error: expect.stringContaining("transport down") }],
    });
    refuse = false;
    const second = await startBlast({ db: pg.db, queue: flaky }, { blastId, tenantId: "acme", message });
    expect(second).toMatchObject({ created: false, published: 3, failed: 0 });
    expect(new Set(published.map((p) => p.jobId)).size).toBe(3);
  });

  test("started again after its chunks were sent, publishes none of them: nothing is sent twice, whatever the fences' age", async () => {
    await seedContacts(pg, "acme", 150);
    t = await startTestModule(pg);
    const input = { blastId: uuidv7(), tenantId: "acme", message };
    await t.module.startBlast(input);
    await t.module.settle();
    // As if the fence cleanup had run: only our record of the sends is left.
    await pg.sql`truncate core.processed_jobs`;
    const again = await t.module.startBlast(input);
    await t.module.settle();
    expect(again).toMatchObject({ created: false, chunks: 2, published: 0, alreadySent: 2 });
    expect(t.fake.count("accepted")).toBe(2);
    expect(t.fake.emails).toHaveLength(150);
  });

  test("through the module, publishes on the marketing lane the chunk consumer reads", async () => {
    await seedContacts(pg, "acme", 120);
    t = await startTestModule(pg, { logger: quietLogger });
    const report = await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.settle();
    expect(report.chunks).toBe(2);
    // The second chunk may first wait for the provider bucket's next token (rate_limited).
    expect(new Set(t.deliveries.map((d) => `${d.queue} ${d.consumer}`))).toEqual(
      new Set([`${EMAIL_MARKETING_QUEUE} notifications.blast-chunk`]),
    );
    expect(t.deliveries.filter((d) => d.result.outcome === "success")).toHaveLength(2);
    expect(t.fake.count("accepted", "/emails/batch")).toBe(2);
  });
});
