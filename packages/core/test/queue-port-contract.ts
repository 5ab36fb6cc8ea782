/**
 * The QueuePort contract: what every transport adapter must do for the
 * harness, checked the same way for each (the in-process adapter and Vercel
 * Queues, push and poll). An adapter's test file calls
 * `queuePortContract(name, makeTransport)`.
 */
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { createEnvelope, type Envelope } from "../src/envelope.ts";
import { InvalidEnvelopeError } from "../src/errors.ts";
import type { BoundConsumer, Delivery, DeliveryResult, QueuePort } from "../src/queue-port.ts";

/** One adapter under test, driven on a clock the test controls. */
export interface ContractTransport {
  readonly port: QueuePort;
  /** Delivers `consumer.queue` to `consumer` from now on. */
  subscribe(consumer: BoundConsumer): void;
  /**
   * Runs every delivery that is due, moving the clock to each next due
   * message, until nothing is left or the next one is more than `horizonMs` ahead.
   */
  settle(horizonMs?: number): Promise<void>;
  now(): number;
  close(): Promise<void>;
}

interface Seen extends Delivery {
  readonly at: number;
  readonly text: string;
}

const ack: DeliveryResult = { outcome: "success", ack: true };
const job = (n = 1): Envelope => createEnvelope({ tenantId: "t-1", kind: "contract.v1", data: { n } });
const text = (body: unknown) =>
  typeof body === "string" ? body : body instanceof Uint8Array ? new TextDecoder().decode(body) : JSON.stringify(body);

let queueSeq = 0;

export function queuePortContract(name: string, makeTransport: () => Promise<ContractTransport>): void {
  describe(`QueuePort contract: ${name}`, () => {
    let transport: ContractTransport;
    beforeEach(async () => {
      transport = await makeTransport();
    });
    afterEach(async () => {
      await transport.close();
    });

    /** A consumer that answers each delivery from a script and records what it saw, and when. */
    const scripted = (
      answer: (n: number) => DeliveryResult = () => ack,
      queue = `contract.q${++queueSeq}.jobs`,
      consumerName = `contract.c${queueSeq}`,
    ) => {
      const seen: Seen[] = [];
      const consumer: BoundConsumer = {
        name: consumerName,
        queue,
        async deliver(delivery) {
          seen.push({ ...delivery, at: transport.now(), text: text(delivery.body) });
          return answer(seen.length);
        },
      };
      transport.subscribe(consumer);
      return { consumer, seen, queue };
    };

    test("publish delivers the envelope once, as JSON, with delivery count 1; an acknowledged message never comes back", async () => {
      const { seen, queue } = scripted();
      const envelope = job();
      await transport.port.publish(queue, envelope);
      await transport.settle();
      await transport.settle(7 * 86_400_000);
      expect(seen).toHaveLength(1);
      expect(JSON.parse(seen[0]?.text ?? "")).toEqual(envelope);
      expect(seen[0]?.deliveryCount).toBe(1);
    });

    test("publish refuses an invalid envelope with InvalidEnvelopeError, and nothing is delivered", async () => {
      const { seen, queue } = scripted();
      await expect(transport.port.publish(queue, { ...job(), job_id: "not-a-uuid" })).rejects.toThrow(
        InvalidEnvelopeError,
      );
      await expect(transport.port.publish(queue, { ...job(), tenant_id: "" })).rejects.toBeInstanceOf(
        InvalidEnvelopeError,
      );
      await transport.settle();
      expect(seen).toHaveLength(0);
    });

    test("schedule holds a message until runAt; a runAt in the past publishes now", async () => {
      const { seen, queue } = scripted();
      const start = transport.now();
      const later = job(1);
      const past = job(2);
      await transport.port.schedule(queue, later, new Date(start + 90_000));
      await transport.port.schedule(queue, past, new Date(start - 60_000));
      await transport.settle();
      expect(seen.map((s) => JSON.parse(s.text).job_id)).toEqual([past.job_id, later.job_id]);
      expect(seen[0]?.at).toBe(start);
      expect(seen[1]?.at).toBeGreaterThanOrEqual(start + 90_000);
      expect(seen[1]?.at).toBeLessThan(start + 91_000);
      await expect(transport.port.schedule(queue, job(), new Date(Number.NaN))).rejects.toThrow(
        /runAt must be a valid Date/,
      );
    });

    test("publish with delayMs holds the message at least that long", async () => {
      const { seen, queue } = scripted();
      const start = transport.now();
      await transport.port.publish(queue, job(), { delayMs: 2_500 });
      await transport.settle();
      expect(seen).toHaveLength(1);
      expect(seen[0]?.at).toBeGreaterThanOrEqual(start + 2_500);
      expect(seen[0]?.at).toBeLessThanOrEqual(start + 3_000);
    });

    test("a retry comes back after the delay the harness asks for, with a growing delivery count", async () => {
      const { seen, queue } = scripted((n) =>
        n < 4 ? { outcome: "retry", ack: false, retryAfterMs: n * 10_000, spendsAttempt: true, error: "e" } : ack,
      );
      await transport.port.publish(queue, job());
      await transport.settle();
      expect(seen.map((s) => s.deliveryCount)).toEqual([1, 2, 3, 4]);
      const gaps = seen.slice(1).map((s, i) => s.at - (seen[i]?.at ?? 0));
      expect(gaps).toEqual([10_000, 20_000, 30_000]);
    });

    test("a rate-limit deferral comes back after its delay without counting as an attempt", async () => {
      const { seen, queue } = scripted((n) => {
        if (n <= 2)
          return { outcome: "rate_limited", ack: false, retryAfterMs: 5_000, spendsAttempt: false, error: "429" };
        if (n === 3) return { outcome: "retry", ack: false, retryAfterMs: 10_000, spendsAttempt: true, error: "e" };
        if (n === 4)
          return { outcome: "rate_limited", ack: false, retryAfterMs: 5_000, spendsAttempt: false, error: "429" };
        return ack;
      });
      const envelope = job();
      await transport.port.publish(queue, envelope);
      await transport.settle();
      expect(seen.map((s) => s.deliveryCount)).toEqual([1, 1, 1, 2, 2]);
      expect(seen.every((s) => JSON.parse(s.text).job_id === envelope.job_id)).toBe(true);
      expect((seen[1]?.at ?? 0) - (seen[0]?.at ?? 0)).toBe(5_000);
    });

    test("a `deferred` delivery (the handler never started) comes back after its delay without counting as an attempt, and every deferral is counted in `deferrals` (#8 items 8, 9)", async () => {
      const deferred = (retryAfterMs: number): DeliveryResult => ({
        outcome: "deferred",
        ack: false,
        retryAfterMs,
        spendsAttempt: false,
        error: "database unreachable",
      });
      const { seen, queue } = scripted((n) => {
        if (n === 1)
          return { outcome: "rate_limited", ack: false, retryAfterMs: 5_000, spendsAttempt: false, error: "429" };
        if (n === 2) return deferred(7_000);
        if (n === 3) return { outcome: "retry", ack: false, retryAfterMs: 10_000, spendsAttempt: true, error: "e" };
        if (n === 4) return deferred(5_000);
        return ack;
      });
      const envelope = job();
      await transport.port.publish(queue, envelope);
      await transport.settle();
      expect(seen.map((s) => s.deliveryCount)).toEqual([1, 1, 1, 2, 2]);
      // Counted across the spent attempt, never reset; 0 or absent on the first delivery.
      expect(seen.map((s) => s.deferrals ?? 0)).toEqual([0, 1, 2, 2, 3]);
      expect(seen.every((s) => JSON.parse(s.text).job_id === envelope.job_id)).toBe(true);
      const gaps = seen.slice(1).map((s, i) => s.at - (seen[i]?.at ?? 0));
      expect(gaps).toEqual([5_000, 7_000, 10_000, 5_000]);
    });

    test("an unacknowledged delivery (dead-letter write failed) comes back with a higher delivery count", async () => {
      const { seen, queue } = scripted((n) =>
        n === 1 ? { outcome: "dead_letter_failed", ack: false, error: "db down" } : ack,
      );
      await transport.port.publish(queue, job());
      await transport.settle();
      expect(seen.map((s) => s.deliveryCount)).toEqual([1, 2]);
      expect(seen[1]?.at).toBeGreaterThan(seen[0]?.at ?? Number.POSITIVE_INFINITY);
    });

    test("a delivery left unacknowledged again and again keeps coming back past the attempt budget, so the harness can write its dead letter (#11 item 1)", async () => {
      const { seen, queue } = scripted((n) =>
        n <= 7 ? { outcome: "dead_letter_failed", ack: false, error: "db down" } : ack,
      );
      await transport.port.publish(queue, job());
      await transport.settle(24 * 3_600_000);
      // Past the default budget of 5 attempts, a letter that cannot be written keeps its job
      // coming back — also past a provider's delivery cap of maxAttempts + 2.
      expect(seen.map((s) => s.deliveryCount)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    });

    test("schedule weeks ahead delivers once, at runAt, with the due time it was scheduled for (#11 item 2)", async () => {
      const { seen, queue } = scripted();
      const runAt = transport.now() + 20 * 86_400_000;
      await transport.port.schedule(queue, job(), new Date(runAt));
      await transport.settle(30 * 86_400_000);
      expect(seen).toHaveLength(1);
      expect(seen[0]?.at).toBeGreaterThanOrEqual(runAt);
      expect(seen[0]?.at).toBeLessThan(runAt + 1_000);
      expect(seen[0]?.deliveryCount).toBe(1);
      expect(seen[0]?.dueAt ?? runAt).toBe(runAt);
    });

    test("publishing the same envelope twice without an idempotency key delivers it twice (a replay is never swallowed)", async () => {
      const { seen, queue } = scripted();
      const envelope = job();
      await transport.port.publish(queue, envelope);
      await transport.port.publish(queue, envelope);
      await transport.settle();
      expect(seen.map((s) => JSON.parse(s.text).job_id)).toEqual([envelope.job_id, envelope.job_id]);
    });

    test("an idempotency key passed by the caller suppresses a second publish with the same key", async () => {
      const { seen, queue } = scripted();
      await transport.port.publish(queue, job(1), { idempotencyKey: "same-key" });
      await transport.port.publish(queue, job(2), { idempotencyKey: "same-key" });
      await transport.settle();
      expect(seen).toHaveLength(1);
    });

    test("every consumer of a queue gets its own copy; a message addressed to one consumer reaches only it", async () => {
      const first = scripted();
      const second = scripted(() => ack, first.queue, `${first.consumer.name}-other`);
      const everyone = job(1);
      await transport.port.publish(first.queue, everyone);
      const addressed = job(2);
      await transport.port.publish(first.queue, addressed, { targetConsumer: first.consumer.name });
      await transport.settle();
      expect(first.seen.map((d) => JSON.parse(d.text))).toEqual(expect.arrayContaining([everyone, addressed]));
      expect(first.seen).toHaveLength(2);
      expect(first.seen.find((d) => JSON.parse(d.text).job_id === addressed.job_id)?.targetConsumer).toBe(
        first.consumer.name,
      );
      expect(second.seen.map((d) => JSON.parse(d.text))).toEqual([everyone]);
    });

    test("queue names with dots, colons and underscores are delivered to their own consumers only", async () => {
      const n = ++queueSeq;
      const dotted = scripted(() => ack, `notif.email.transactional${n}`, `contract.dotted${n}`);
      const underscored = scripted(() => ack, `notif_email.transactional${n}`, `contract.underscored${n}`);
      const colon = scripted(() => ack, `notif:email.transactional${n}`, `contract.colon${n}`);
      const a = job(1);
      const b = job(2);
      const c = job(3);
      await transport.port.publish(dotted.queue, a);
      await transport.port.publish(underscored.queue, b);
      await transport.port.publish(colon.queue, c);
      await transport.settle();
      expect(dotted.seen.map((s) => JSON.parse(s.text).job_id)).toEqual([a.job_id]);
      expect(underscored.seen.map((s) => JSON.parse(s.text).job_id)).toEqual([b.job_id]);
      expect(colon.seen.map((s) => JSON.parse(s.text).job_id)).toEqual([c.job_id]);
    });
  });
}
