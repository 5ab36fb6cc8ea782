/**
 * The in-process adapter's overhead (#23 item 3): N jobs (env N, default
 * 100,000) through a trivial in-memory consumer that acks at once, measured
 * (a) calling its deliver() directly N times with the adapter's concurrency
 * (CONCURRENCY workers, default 4, each awaiting one delivery at a time), and
 * (b) publishing the N jobs through `createMemoryQueue` and `drain()`ing it.
 * Also (printed on its own line, not part of the ratio) `delayed_first_ms`:
 * the first half published with a 60 s delay, then the second half at once,
 * drained on a manual clock — a lane whose head is not visible yet, where a
 * scan of every waiting message per delivery would cost O(N²).
 * The envelopes are built beforehand, outside both timings. Goal: adapter
 * ≤ 1.2 × direct, and a cost per job that does not grow with N.
 *
 * Then the same comparison with the harness itself (the table: "the
 * harness through the in-process adapter"): HARNESS_N jobs (default 20,000)
 * of bench/path-variants.ts's consumer over Postgres, delivered by 16 loops
 * calling its deliver(), against published to `createMemoryQueue` with
 * concurrency 16 and drained. Goal: harness_ratio ≤ 1.2 (HARNESS_N=0 skips it).
 *
 * Run: pnpm --filter @softcrum/core bench:memory
 * Each timing is the median of ROUNDS runs (default 3).
 * The last line is JSON: {"n", "direct_ms", "adapter_ms", "ratio", "harness_n",
 * "harness_direct_ms", "harness_adapter_ms", "harness_ratio"}.
 */
import { performance } from "node:perf_hooks";
import { createMemoryQueue } from "../src/adapters/memory/index.ts";
import { createManualClock } from "../src/clock.ts";
import { createEnvelope, type Envelope } from "../src/envelope.ts";
import type { BoundConsumer, Delivery, DeliveryResult } from "../src/queue-port.ts";
import { benchDatabase } from "./bench-database.ts";
import { CONCURRENCY as HARNESS_CONCURRENCY, makeBodies, pathVariants, timed } from "./path-variants.ts";

const N = Number(process.env["N"] ?? 100_000);
const HARNESS_N = Number(process.env["HARNESS_N"] ?? 20_000);
const CONCURRENCY = Number(process.env["CONCURRENCY"] ?? 4);
if (!Number.isInteger(N) || N <= 0) throw new Error(`N must be a positive integer, not ${process.env["N"]}`);
if (!Number.isInteger(HARNESS_N) || HARNESS_N < 0) {
  throw new Error(`HARNESS_N must be a whole number (0 skips the harness), not ${process.env["HARNESS_N"]}`);
}

const ACK: DeliveryResult = { outcome: "success", ack: true };

/** A consumer with no dependencies: counts its deliveries and acks each. */
function trivialConsumer(): BoundConsumer & { delivered: number } {
  return {
    name: "bench",
    queue: "bench",
    delivered: 0,
    async deliver(_delivery: Delivery): Promise<DeliveryResult> {
      this.delivered += 1;
      return ACK;
    },
  };
}

const envelopes: Envelope[] = Array.from({ length: N }, (_, i) =>
  createEnvelope({ tenantId: "t", kind: "bench.v1", data: { i } }),
);
const deliveries: Delivery[] = envelopes.map((e, i) => ({
  body: JSON.stringify(e),
  deliveryCount: 1,
  messageId: String(i),
  dueAt: 0,
}));

async function direct(n = N): Promise<number> {
  const consumer = trivialConsumer();
  let next = 0;
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= n) return;
      await consumer.deliver(deliveries[i] as Delivery);
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const ms = performance.now() - started;
  if (consumer.delivered !== n) throw new Error(`direct: ${consumer.delivered} of ${n} delivered`);
  return ms;
}

async function adapter(n = N): Promise<number> {
  const consumer = trivialConsumer();
  const queue = createMemoryQueue({ concurrency: CONCURRENCY });
  queue.subscribe(consumer);
  const started = performance.now();
  for (let i = 0; i < n; i++) await queue.publish("bench", envelopes[i] as Envelope);
  await queue.drain();
  const ms = performance.now() - started;
  const pending = queue.pending();
  await queue.close();
  if (consumer.delivered !== n || pending !== 0) {
    throw new Error(`adapter: ${consumer.delivered} of ${n} delivered, ${pending} pending`);
  }
  return ms;
}

async function delayedFirst(n = N): Promise<number> {
  const consumer = trivialConsumer();
  const queue = createMemoryQueue({ clock: createManualClock(0), concurrency: CONCURRENCY });
  queue.subscribe(consumer);
  const half = n >> 1;
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    await queue.publish("bench", envelopes[i] as Envelope, i < half ? { delayMs: 60_000 } : undefined);
  }
  await queue.drain();
  const ms = performance.now() - started;
  const pending = queue.pending();
  await queue.close();
  if (consumer.delivered !== n || pending !== 0) {
    throw new Error(`delayed first: ${consumer.delivered} of ${n} delivered, ${pending} pending`);
  }
  return ms;
}

const ROUNDS = Number(process.env["ROUNDS"] ?? 3);
const round = (ms: number) => Math.round(ms * 10) / 10;
/** The median of `ROUNDS` runs (a garbage collection in one run skews a single timing). */
async function median(run: () => Promise<number>): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < ROUNDS; i++) times.push(await run());
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)] as number;
}

// A short warm-up of both paths, so neither pays for JIT compilation alone.
await direct(Math.min(N, 2_000));
await adapter(Math.min(N, 2_000));
const directMs = await median(() => direct());
const adapterMs = await median(() => adapter());
const delayedFirstMs = await median(() => delayedFirst());
console.log(`direct:  ${round(directMs)} ms (${round((directMs * 1000) / N)} µs/job)`);
console.log(`adapter: ${round(adapterMs)} ms (${round((adapterMs * 1000) / N)} µs/job)`);
console.log(JSON.stringify({ n: N, delayed_first_ms: round(delayedFirstMs) }));

/**
 * The harness over Postgres: deliver() called by 16 loops, against the same
 * jobs published to the in-process queue (concurrency 16) and drained; the
 * median of ROUNDS runs of each, alternated, each run on fresh jobs.
 */
async function harnessRatio(): Promise<Record<string, number>> {
  const bench = await benchDatabase("memory", HARNESS_CONCURRENCY);
  try {
    const { bound } = pathVariants(bench.sql);
    const direct = async (bodies: string[]) =>
      timed(bodies, async (body) => {
        const result = await bound.deliver({ body, deliveryCount: 1 });
        if (result.outcome !== "success") throw new Error(`harness direct: ${result.outcome}`);
      });
    const throughQueue = async (bodies: string[]) => {
      const queue = createMemoryQueue({ concurrency: HARNESS_CONCURRENCY });
      queue.subscribe(bound);
      const envelopes = bodies.map((body) => JSON.parse(body) as Envelope);
      const started = performance.now();
      for (const envelope of envelopes) await queue.publish(bound.queue, envelope);
      await queue.drain();
      const ms = performance.now() - started;
      const pending = queue.pending();
      await queue.close();
      if (pending !== 0) throw new Error(`harness through the queue: ${pending} pending`);
      return ms;
    };
    await direct(makeBodies(500));
    await throughQueue(makeBodies(500));
    const directTimes: number[] = [];
    const queueTimes: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      directTimes.push(await direct(makeBodies(HARNESS_N)));
      queueTimes.push(await throughQueue(makeBodies(HARNESS_N)));
    }
    const [row] = await bench.sql<{ n: number }[]>`select count(*)::int as n from bench_ledger`;
    const expected = 1000 + 2 * ROUNDS * HARNESS_N;
    if (row?.n !== expected) throw new Error(`harness: ${row?.n} ledger rows, expected ${expected}`);
    const mid = (times: number[]) => [...times].sort((a, b) => a - b)[Math.floor(times.length / 2)] as number;
    return {
      harness_n: HARNESS_N,
      harness_direct_ms: round(mid(directTimes)),
      harness_adapter_ms: round(mid(queueTimes)),
      harness_ratio: Math.round((mid(queueTimes) / mid(directTimes)) * 100) / 100,
    };
  } finally {
    await bench.drop();
  }
}

const harness = HARNESS_N > 0 ? await harnessRatio() : {};
console.log(
  JSON.stringify({
    n: N,
    direct_ms: round(directMs),
    adapter_ms: round(adapterMs),
    ratio: Math.round((adapterMs / directMs) * 100) / 100,
    ...harness,
  }),
);
