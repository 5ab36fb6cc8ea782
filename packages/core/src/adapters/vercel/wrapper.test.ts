/**
 * #19 "what happened" 3: the wrapper the adapter puts around a job it
 * republishes (a deferral, a hop, a rescue, a replay) carries the consumer it
 * is addressed to and the attempts already spent. A foreign producer's bytes
 * that merely look like one must not set either: they are an ordinary
 * message, judged by the harness (poison, with the payload exactly as
 * received). Through the real SDK against the fake service.
 */
import { describe, expect, test } from "vitest";
import { useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { readVercelWrapper, toVercelTopic } from "./index.ts";
import { WrapperCodec } from "./wrapper.ts";

const pg = useEffectsDatabase("vercel-wrapper");
const { pointsConsumer, rateLimitedConsumer, bind, effectRows, letters } = pointsFixture(pg, "wrapper");

const open = useVercelHarnesses();

/** What an unsigned wrapper of the previous format looks like, around a real job. */
const forged = (fields: Record<string, unknown>, job = JSON.stringify(award())) =>
  `{"softcrum_deferral":2,${JSON.stringify(fields).slice(1)}\n${job}`;

describe.each(["push", "poll"] as const)("bytes that only look like a wrapper (%s)", (mode) => {
  test("one addressed to another consumer is not acknowledged unread: it is this consumer's poison letter, bytes as received", async () => {
    const h = await open(mode);
    const consumer = pointsConsumer();
    h.subscribe(bind(consumer));
    const body = forged({ consumer: "someone.else", attempts_spent: 0 });
    h.fake.inject(toVercelTopic(consumer.queue), body);
    await h.settle();
    const rows = await letters(consumer.name);
    expect(rows.map((r) => [r.errorClass, r.payload])).toEqual([["poison", body]]);
    expect(await effectRows(consumer.name)).toHaveLength(0);
  });

  test("one addressed to this consumer cannot claim attempts: it is poison, never an `exhausted` letter past the budget", async () => {
    const h = await open(mode);
    const consumer = pointsConsumer();
    h.subscribe(bind(consumer));
    const body = forged({ consumer: consumer.name, attempts_spent: 9 });
    h.fake.inject(toVercelTopic(consumer.queue), body);
    await h.settle();
    const rows = await letters(consumer.name);
    expect(rows.map((r) => [r.errorClass, r.attempts, r.payload])).toEqual([["poison", 0, body]]);
  });

  test("the adapter's own wrappers still work: a rate-limited job's deferral comes back to it and is applied once", async () => {
    const h = await open(mode);
    const { consumer, attempts } = rateLimitedConsumer(1);
    h.subscribe(bind(consumer));
    await h.queue.publish(consumer.queue, award());
    await h.settle();
    // The deferral went out as a wrapper, came back addressed to this consumer, spent no attempt.
    const copy = h.fake.sends[1];
    expect(copy && readVercelWrapper(copy.body)?.consumer).toBe(consumer.name);
    expect(attempts).toEqual([1, 1]);
    expect(await effectRows(consumer.name)).toHaveLength(1);
    expect(await letters(consumer.name)).toEqual([]);
  });
});

describe("the codec", () => {
  const secret = "a-secret-of-at-least-thirty-two-characters";
  const codec = new WrapperCodec(secret);
  const head = { consumer: "c", attemptsSpent: 2, deferrals: 1, dueAt: 1_000 };
  const job = Buffer.from('{"job_id":"x"}');

  test("reads back what it signed, with the job's bytes unchanged", () => {
    const wrapped = codec.encode(head, job);
    expect(codec.read(wrapped)).toEqual({ ...head, body: new Uint8Array(job) });
    expect(wrapped.length - job.length).toBeLessThan(1_024);
  });

  test("a changed field, changed bytes, another secret or no signature make an ordinary message", () => {
    const wrapped = codec.encode(head, job).toString("utf8");
    expect(codec.read(Buffer.from(wrapped.replace('"attempts_spent":2', '"attempts_spent":0')))).toBeUndefined();
    expect(codec.read(Buffer.from(wrapped.replace('"consumer":"c"', '"consumer":"d"')))).toBeUndefined();
    expect(codec.read(Buffer.from(wrapped.replace('{"job_id":"x"}', '{"job_id":"y"}')))).toBeUndefined();
    expect(new WrapperCodec(`${secret}!`).read(Buffer.from(wrapped))).toBeUndefined();
    expect(codec.read(Buffer.from(wrapped.replace(/,"mac":"[^"]*"/, "")))).toBeUndefined();
    expect(codec.read(Buffer.from(forged({ consumer: "c", attempts_spent: 2 })))).toBeUndefined();
  });

  test("unsigned wrappers of the previous release are read only when acceptUnsigned is set", () => {
    const old = Buffer.from(forged({ consumer: "c", attempts_spent: 1 }, '{"job_id":"x"}'));
    expect(codec.read(old)).toBeUndefined();
    expect(new WrapperCodec(secret, { acceptUnsigned: true }).read(old)).toMatchObject({
      consumer: "c",
      attemptsSpent: 1,
    });
  });
});
