/**
 * #19: every service answer on every path that republishes means one thing.
 * The original is acknowledged only when its successor is known stored (a
 * 201 with an id); anything else — a 202 stored later or never, a 2xx
 * without an id (nothing stored), a 429 with Retry-After, a 5xx, no answer
 * in time, a connection lost before or after the message was stored —
 * keeps the original (or, when the service is about
 * to drop it, writes its dead letter now), and a delivery the adapter kept
 * never counts as an attempt. Through the real SDK against the fake service,
 * push and poll, the first republish of each path answered each way.
 * (The outbox relay's answers: `src/outbox/relay-answers.test.ts`; an
 * operator's replay: `src/ops/ops-replay.test.ts`.)
 */
import { describe, expect, test } from "vitest";
import type { FakeReply } from "../../../test/fake-vercel-queues.ts";
import { effects, silentLogger, useEffectsDatabase } from "../../../test/fixtures.ts";
import { award, pointsFixture, pointsSchema } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { bindConsumer, defineConsumer, type HandlerContext } from "../../consumer.ts";
import { RateLimitedError } from "../../errors.ts";
import type { Delivery } from "../../queue-port.ts";

const pg = useEffectsDatabase("vercel-answer-matrix");
const { effectRows, letters } = pointsFixture(pg, "matrix");
const open = useVercelHarnesses();

/** How long the adapter waits for a republish's answer in these tests (the "timeout" answer waits longer). */
const REPUBLISH_TIMEOUT_MS = 1_000;

const ANSWERS: readonly (readonly [string, FakeReply | undefined])[] = [
  ["201", undefined],
  ["202, stored later", { status: 202 }],
  ["202, never stored", { status: 202, store: false }],
  // A 2xx that names no copy stored nothing: read as not known stored, like a 202, never as stored.
  ["200 without an id", { status: 200, body: {} }],
  ["201 with an empty id", { status: 201, body: { messageId: "" } }],
  ["429 with Retry-After", { status: 429, retryAfter: 30 }],
  ["500", { status: 500 }],
  ["502 consumer_discovery_failed", { status: 502, errorCode: "consumer_discovery_failed" }],
  ["503", { status: 503 }],
  ["no answer in time (stored)", { status: 201, delayMs: REPUBLISH_TIMEOUT_MS + 500 }],
  ["connection lost before storing", { status: 201, dropConnection: "before" }],
  ["connection lost after storing", { status: 201, dropConnection: "after" }],
];

let seq = 0;

/** A consumer crediting one effect per job; `before` runs first (throw to fail); every run's attempt and run number recorded. */
function matrixConsumer(
  before: (ctx: HandlerContext, run: number) => void,
  retry?: { maxAttempts: number; baseDelayMs: number; maxDelayMs: number },
) {
  seq += 1;
  const name = `matrix.c${seq}`;
  const runs: { attempt: number; run: number }[] = [];
  const consumer = defineConsumer({
    name,
    queue: `matrix.q${seq}`,
    kind: "points.award.v1",
    schema: pointsSchema,
    ...(retry ? { retry } : {}),
    async handle(data, ctx) {
      runs.push({ attempt: ctx.attempt, run: runs.length + 1 });
      before(ctx, runs.length);
      await ctx.tx.insert(effects).values({ jobId: ctx.envelope.job_id, consumer: name, amount: data.points });
    },
  });
  return { consumer, runs };
}

type Path = "deferral" | "retry past a lease" | "hop" | "rescue at the cap";
const PATHS: readonly Path[] = ["deferral", "retry past a lease", "hop", "rescue at the cap"];
const MAX_DELIVERIES = 7;

describe.each(["push", "poll"] as const)("every answer on every republishing path (%s)", (mode) => {
  describe.each(PATHS)("%s", (path) => {
    test.each(ANSWERS)(
      "answered %s: nothing lost, nothing doubled, attempts never above handler runs",
      async (_, answer) => {
        let faulted = false;
        const h = await open(mode, {
          republishTimeoutMs: REPUBLISH_TIMEOUT_MS,
          maxDeliveries: MAX_DELIVERIES,
          fake: {
            faults: {
              // The path's first republish (the adapter's own sends carry its key) answers this way.
              send: ({ idempotencyKey }) => {
                if (faulted || !idempotencyKey?.startsWith("softcrum-deferral:")) return undefined;
                faulted = true;
                return answer;
              },
            },
          },
        });
        const { consumer, runs } =
          path === "deferral"
            ? matrixConsumer((_ctx, run) => {
                if (run === 1) throw new RateLimitedError("partner 429", { retryAfterMs: 20_000 });
              })
            : path === "retry past a lease"
              ? // Its first retry waits about 1.5 h, longer than a lease can: a copy carries it.
                matrixConsumer(
                  (_ctx, run) => {
                    if (run === 1) throw new Error("partner 503");
                  },
                  { maxAttempts: 3, baseDelayMs: 7_200_000, maxDelayMs: 28_800_000 },
                )
              : matrixConsumer(() => {});
        const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, random: () => 0.5 });
        let crashes = 0;
        h.subscribe(
          path === "rescue at the cap"
            ? {
                ...bound,
                name: bound.name,
                queue: bound.queue,
                maxAttempts: bound.maxAttempts,
                holds: bound.holds,
                deadLetterNow: bound.deadLetterNow?.bind(bound),
                // A worker that dies on the original every time, up to its last permitted delivery.
                deliver: (delivery: Delivery) => {
                  if (crashes < MAX_DELIVERIES && delivery.deliveryCount <= MAX_DELIVERIES && !faulted) {
                    crashes += 1;
                    return Promise.reject(new Error("worker crashed"));
                  }
                  return bound.deliver(delivery);
                },
              }
            : bound,
        );
        const job = award();
        if (path === "hop") await h.queue.schedule(consumer.queue, job, new Date(h.fake.clock.now() + 10 * 86_400_000));
        else await h.queue.publish(consumer.queue, job);
        await h.settle(30 * 86_400_000);
        // Let a send still in flight after a timeout land, and deliver what it stored.
        if (answer?.delayMs !== undefined) {
          await new Promise((r) => setTimeout(r, answer.delayMs));
          await h.settle(30 * 86_400_000);
        }

        expect(faulted).toBe(true);
        const done = await effectRows(consumer.name);
        const pending = (await letters(consumer.name)).filter((l) => l.status === "pending_review");
        // Exactly one thing holds the job: its effect, or (a rescue the service did not store) its letter.
        expect(done.length + pending.length).toBe(1);
        expect(done.length).toBeLessThanOrEqual(1);
        if (path !== "rescue at the cap") expect(done).toHaveLength(1);
        // The rescued copy carries the 7 crashed deliveries as attempts spent: past the budget, its letter holds the job.
        if (path === "rescue at the cap") expect(pending.map((l) => l.errorClass)).toEqual(["exhausted"]);
        // Attempts count handler runs that spent one, nothing else.
        for (const r of runs) expect(r.attempt).toBeLessThanOrEqual(r.run);
        if (path === "deferral" || path === "hop") expect(runs.every((r) => r.attempt === 1)).toBe(true);
        if (path === "retry past a lease") expect(runs.map((r) => r.attempt)).toEqual([1, 2]);
        expect(h.fake.drops).toEqual([]);
      },
    );
  });
});
