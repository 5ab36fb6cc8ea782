import { useModuleDatabase } from "@softcrum/core/testing";
import { uuidv7 } from "uuidv7";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { wireError } from "../test/fake-resend-wire.ts";
import { message, outcomesOf, seedContacts, startTestModule, type TestModule } from "../test/harness.ts";
import { EMAIL_MARKETING_QUEUE, EMAIL_TRANSACTIONAL_QUEUE } from "./email-lanes.ts";
import { isNotificationsError } from "./errors.ts";
import { transactionalEmailIdempotencyKey } from "./transactional-email.ts";

const pg = useModuleDatabase("notifications-transactional");
const EMAIL = "notifications.transactional-email";
let t: TestModule;

beforeEach(async () => {
  await pg.sql`truncate core.processed_jobs, core.dead_letters, notifications.contacts, notifications.blasts,
    notifications.blast_recipients, notifications.blast_chunk_sends, notifications.email_sends cascade`;
  t = await startTestModule(pg);
});
afterEach(async () => {
  await t.close();
});

const receipt = { to: "ann@example.com", from: "Acme <orders@acme.example>", subject: "Your receipt", text: "Thanks!" };

describe("transactional e-mail", () => {
  test("goes on notif.email.transactional, one POST /emails with the job's key, recorded with its fence (#20 item 4)", async () => {
    expect(t.module.transactionalEmail.queue).toBe(EMAIL_TRANSACTIONAL_QUEUE);
    const envelope = await t.module.sendTransactionalEmail({ tenantId: "acme", ...receipt });
    // Delivered twice: the fence applies it once.
    await t.module.queue.publish(EMAIL_TRANSACTIONAL_QUEUE, envelope);
    await t.module.settle();
    expect(new Set(t.deliveries.map((d) => d.queue))).toEqual(new Set([EMAIL_TRANSACTIONAL_QUEUE]));
    // The second copy may first wait for the tenant bucket's next token (rate_limited).
    expect(
      outcomesOf(t.deliveries, EMAIL)
        .filter((o) => o !== "rate_limited")
        .sort(),
    ).toEqual(["duplicate", "success"]);
    expect(t.fake.requests.map((r) => [r.path, r.outcome, r.idempotencyKey])).toEqual([
      ["/emails", "accepted", transactionalEmailIdempotencyKey(envelope.job_id)],
    ]);
    expect(t.fake.requests[0]?.body).toMatchObject({
      to: ["ann@example.com"],
      from: receipt.from,
      subject: "Your receipt",
      text: "Thanks!",
    });
    const rows = await pg.sql`select job_id, lane, to_address, provider_email_id from notifications.email_sends`;
    expect(rows).toEqual([
      {
        job_id: envelope.job_id,
        lane: "transactional",
        to_address: "ann@example.com",
        provider_email_id: t.fake.emails[0]?.id,
      },
    ]);
  });

  test("and a blast at the same time each stay on their own lane, sharing the Resend bucket", async () => {
    await seedContacts(pg, "acme", 200);
    await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.sendTransactionalEmail({ tenantId: "acme", ...receipt });
    await t.module.settle();
    const lanes = new Set(t.deliveries.map((d) => `${d.consumer} ${d.queue}`));
    expect(lanes).toEqual(
      new Set([`${EMAIL} ${EMAIL_TRANSACTIONAL_QUEUE}`, `notifications.blast-chunk ${EMAIL_MARKETING_QUEUE}`]),
    );
    expect([t.fake.count("accepted", "/emails"), t.fake.count("accepted", "/emails/batch")]).toEqual([1, 2]);
    expect(t.fake.emails).toHaveLength(201);
  });

  test("a blast yields to the channel's outstanding transactional e-mail: every one is sent before the first chunk (#20 item 4)", async () => {
    await seedContacts(pg, "acme", 250);
    // Five receipts: the tenant's bucket makes some of them wait, and they stay outstanding meanwhile.
    for (let i = 0; i < 5; i++)
      await t.module.sendTransactionalEmail({ tenantId: "acme", ...receipt, to: `r${i}@example.com` });
    await t.module.startBlast({ blastId: uuidv7(), tenantId: "acme", message });
    await t.module.settle();
    const accepted = t.fake.requests.filter((r) => r.outcome === "accepted").map((r) => r.path);
    expect(accepted).toEqual([
      "/emails",
      "/emails",
      "/emails",
      "/emails",
      "/emails",
      "/emails/batch",
      "/emails/batch",
      "/emails/batch",
    ]);
    expect(outcomesOf(t.deliveries, "notifications.blast-chunk")).toContain("yielded");
    expect(t.fake.emails).toHaveLength(255);
  });

  test("a 429 on POST /emails defers it without an attempt; the e-mail is sent once after", async () => {
    t.fake.rateLimitNext(3, 1);
    await t.module.sendTransactionalEmail({ tenantId: "acme", ...receipt });
    await t.module.settle();
    expect(t.fake.requests.map((r) => r.status)).toEqual([429, 429, 429, 200]);
    expect(outcomesOf(t.deliveries, EMAIL).filter((o) => o !== "rate_limited")).toEqual(["success"]);
    expect(Math.max(...t.deliveries.map((d) => d.deliveryCount))).toBe(1);
  });

  test("a 403 invalid key is permanent: dead-lettered after one attempt", async () => {
    t.fake.failNext(1, wireError(403, "invalid_api_key", "API key is invalid."));
    await t.module.sendTransactionalEmail({ tenantId: "acme", ...receipt });
    await t.module.settle();
    const letters = await pg.sql`select consumer, error_class, attempts from core.dead_letters`;
    expect(letters).toEqual([{ consumer: EMAIL, error_class: "permanent", attempts: 1 }]);
    expect(t.fake.emails).toEqual([]);
  });

  test("bad input is an InvalidEmailError for the caller, never a message", async () => {
    const bad = t.module.sendTransactionalEmail({
      tenantId: "acme",
      ...receipt,
      to: "not an address",
      text: undefined,
    });
    await expect(bad).rejects.toSatisfy((e) => isNotificationsError(e, "INVALID_EMAIL"));
    await expect(bad).rejects.toThrow(/to:.*html: html or text is required/s);
    expect(t.module.queue.pending()).toBe(0);
  });
});
