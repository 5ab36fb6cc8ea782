// The fake speaks Resend's wire protocol as the real SDK sends and reads it.
import { Resend } from "resend";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { type FakeResend, startFakeResend } from "./fake-resend.ts";

let fake: FakeResend;
let resend: Resend;
beforeEach(async () => {
  fake = await startFakeResend();
  resend = new Resend(fake.apiKey, { baseUrl: fake.url });
});
afterEach(() => fake.close());

const email = (to: string) => ({ from: "Acme <news@acme.example>", to: [to], subject: "Hi", html: "<p>Hi</p>" });

describe("the fake Resend server, through the real SDK", () => {
  test("sends a batch: the SDK's path, headers and body, answered with one id per e-mail", async () => {
    const result = await resend.batch.send([email("a@example.com"), email("b@example.com")], { idempotencyKey: "k-1" });
    expect(result.error).toBeNull();
    expect(result.data?.data.map((d) => d.id)).toEqual(fake.emails.map((e) => e.id));
    expect(fake.requests[0]).toMatchObject({
      method: "POST",
      path: "/emails/batch",
      idempotencyKey: "k-1",
      authorization: `Bearer ${fake.apiKey}`,
      batchValidation: "strict",
      userAgent: expect.stringMatching(/^resend-node:/),
    });
    expect(result.headers?.["ratelimit-limit"]).toBe("10");
  });

  test("the same key and body is answered again without sending; another body under it is a 409", async () => {
    const first = await resend.emails.send(email("a@example.com"), { idempotencyKey: "k-2" });
    const again = await resend.emails.send(email("a@example.com"), { idempotencyKey: "k-2" });
    const other = await resend.emails.send(email("b@example.com"), { idempotencyKey: "k-2" });
    expect(again.data).toEqual(first.data);
    expect(other.error).toMatchObject({ statusCode: 409, name: "invalid_idempotent_request" });
    expect(fake.requests.map((r) => r.outcome)).toEqual(["accepted", "replayed", "rejected"]);
    expect(fake.emails).toHaveLength(1);
  });

  test("a key still in flight is a 409 concurrent_idempotent_requests; a failure is not remembered", async () => {
    let release: () => void = () => {};
    fake.beforeAccept(() => new Promise<void>((resolve) => (release = resolve)));
    const slow = resend.emails.send(email("a@example.com"), { idempotencyKey: "k-3" });
    while (fake.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    const concurrent = await resend.emails.send(email("a@example.com"), { idempotencyKey: "k-3" });
    expect(concurrent.error).toMatchObject({ statusCode: 409, name: "concurrent_idempotent_requests" });
    fake.beforeAccept(undefined);
    release();
    expect((await slow).error).toBeNull();

    fake.failNext(1, { statusCode: 500, name: "internal_server_error", message: "boom" });
    expect((await resend.emails.send(email("c@example.com"), { idempotencyKey: "k-4" })).error?.statusCode).toBe(500);
    expect((await resend.emails.send(email("c@example.com"), { idempotencyKey: "k-4" })).error).toBeNull();
    expect(fake.emails.map((e) => e.to[0])).toEqual(["a@example.com", "c@example.com"]);
  });

  test("answers 429 with Retry-After for the next N requests, before looking at anything else", async () => {
    fake.rateLimitNext(2, 7);
    const results = [];
    for (let i = 0; i < 3; i++)
      results.push(await resend.emails.send(email("a@example.com"), { idempotencyKey: "k-5" }));
    expect(results.map((r) => r.error?.statusCode ?? 200)).toEqual([429, 429, 200]);
    expect(results[0]?.error?.name).toBe("rate_limit_exceeded");
    expect(results[0]?.headers?.["retry-after"]).toBe("7");
  });

  test("a seeded fraction of 429s is the same storm every run", async () => {
    const statuses = async () => {
      fake.rateLimitFraction(0.5, { seed: 7 });
      const out: number[] = [];
      for (let i = 0; i < 20; i++)
        out.push((await resend.emails.send(email(`x${i}@example.com`))).error?.statusCode ?? 200);
      return out;
    };
    const first = await statuses();
    expect(await statuses()).toEqual(first);
    expect(first.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(first.filter((s) => s === 200).length).toBeGreaterThan(0);
  });

  test("refuses what Resend refuses: no key, a wrong key, more than 100 in a batch, an e-mail without a body", async () => {
    expect(
      (await new Resend("re_wrong", { baseUrl: fake.url }).emails.send(email("a@example.com"))).error,
    ).toMatchObject({
      statusCode: 403,
      name: "invalid_api_key",
    });
    const many = Array.from({ length: 101 }, (_, i) => email(`p${i}@example.com`));
    expect((await resend.batch.send(many)).error).toMatchObject({ statusCode: 422, name: "validation_error" });
    const noBody = {
      from: "a@acme.example",
      to: ["b@example.com"],
      subject: "s",
      html: undefined as unknown as string,
    };
    expect((await resend.emails.send(noBody)).error).toMatchObject({ statusCode: 422, name: "validation_error" });
    expect(fake.emails).toEqual([]);
  });
});
