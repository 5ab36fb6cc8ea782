/** Rate-limited deliveries: waits that grow, a floor under Retry-After, never an attempt spent (#8 item 9). */
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../test/fixtures.ts";
import { createMemoryQueue, type DeliveryEvent } from "./adapters/memory/index.ts";
import { createManualClock } from "./clock.ts";
import { bindConsumer, type ConsumerDefinition, defineConsumer, type HarnessDeps } from "./consumer.ts";
import { deadLetters } from "./db/schema.ts";
import { createEnvelope } from "./envelope.ts";
import { RateLimitedError } from "./errors.ts";
import { DEFERRAL_FLOOR_MS, RATE_LIMIT_BACKOFF } from "./retry.ts";

const pg = useEffectsDatabase("rate_limit");

const schema = z.object({ customerId: z.string().min(1), points: z.number().int().positive() });
let seq = 0;
function consumerThat(handle: ConsumerDefinition<typeof schema>["handle"]) {
  seq += 1;
  return defineConsumer({
    name: `rl.award-${seq}`,
    queue: `rl.points-${seq}`,
    kind: "points.award.v1",
    schema,
    handle,
  });
}
const award = () => createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c-1", points: 3 } });
const deps = (extra: Partial<HarnessDeps> = {}): HarnessDeps => ({ db: pg.db, logger: silentLogger, ...extra });
const effectCount = async () => (await pg.sql<{ n: number }[]>`select count(*)::int as n from test_effects`)[0]?.n;

describe("rate-limited deliveries (#8 item 9)", () => {
  test("consecutive rate-limited deliveries of one job wait longer each time up to a cap, never spend an attempt and never dead-letter (#8 item 9)", async () => {
    const attempts: number[] = [];
    const limited = 8; // past the 5-attempt budget
    const consumer = consumerThat(async (data, { tx, envelope, attempt }) => {
      attempts.push(attempt);
      if (attempts.length <= limited) throw new RateLimitedError("provider bucket empty"); // no Retry-After
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "rl", amount: data.points });
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now, random: () => 0.5 })));
    await queue.publish(consumer.queue, award());
    await queue.drain();

    expect(attempts).toHaveLength(limited + 1);
    expect(new Set(attempts)).toEqual(new Set([1]));
    expect(events.map((e) => e.result.outcome)).toEqual([...Array(limited).fill("rate_limited"), "success"]);
    expect(events.every((e) => e.deliveryCount === 1)).toBe(true);
    const gaps = events.slice(1).map((e, i) => e.at - (events[i]?.at ?? 0));
    // Growing until the cap, then holding there.
    const capped = gaps.findIndex((g) => g > RATE_LIMIT_BACKOFF.capMs / 2);
    expect(capped).toBeGreaterThan(2);
    for (let i = 1; i <= capped; i++) expect(gaps[i]).toBeGreaterThan(gaps[i - 1] as number);
    for (const gap of gaps.slice(capped)) expect(gap).toBeLessThanOrEqual(RATE_LIMIT_BACKOFF.capMs);
    expect(gaps.slice(capped + 1).every((g) => g === gaps[capped])).toBe(true);
    expect(await pg.db.select().from(deadLetters)).toHaveLength(0);
    expect(await effectCount()).toBe(1);
    await queue.close();
  });

  test.each([
    ["Retry-After: 0", { status: 429, retryAfter: "0" }],
    ["a Retry-After date in the past", { status: 429, retryAfter: new Date(Date.now() - 60_000).toUTCString() }],
    ["retryAfterMs 0", { status: 429, retryAfterMs: 0 }],
  ])("%s waits at least the 1 s floor, so a provider cannot make a hot loop (#8 item 9)", async (_label, fields) => {
    let runs = 0;
    const consumer = consumerThat(async (data, { tx, envelope }) => {
      runs += 1;
      if (runs <= 3) throw Object.assign(new Error("Too Many Requests"), fields);
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "rl", amount: data.points });
    });
    const clock = createManualClock();
    const queue = createMemoryQueue({ clock });
    const events: DeliveryEvent[] = [];
    queue.onDelivery((e) => events.push(e));
    queue.subscribe(bindConsumer(consumer, deps({ now: clock.now })));
    await queue.publish(consumer.queue, award());
    await queue.drain();

    expect(events.map((e) => e.result.outcome)).toEqual(["rate_limited", "rate_limited", "rate_limited", "success"]);
    for (const event of events.slice(0, 3)) {
      expect(event.result).toMatchObject({ outcome: "rate_limited", spendsAttempt: false });
      expect((event.result as { retryAfterMs: number }).retryAfterMs).toBeGreaterThanOrEqual(DEFERRAL_FLOOR_MS);
    }
    const gaps = events.slice(1).map((e, i) => e.at - (events[i]?.at ?? 0));
    for (const gap of gaps) expect(gap).toBeGreaterThanOrEqual(DEFERRAL_FLOOR_MS);
    expect(await effectCount()).toBe(1);
    await queue.close();
  });
});
