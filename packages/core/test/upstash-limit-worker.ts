// A worker process for the Upstash rate-limiter test (#20): it takes tokens
// from one bucket through `upstashRateLimiter` and the real `@upstash/redis`
// client, against the test's REST shim, with LOOPS concurrent loops, from
// START_AT (epoch ms, so the processes start together) for DURATION_MS. A
// refused take waits its `retryAfterMs`, as a deferred delivery would. It
// prints one line and exits 0:
//   DONE {"stamps":[…],"refused":n,"errors":[…]}
// where `stamps` are the instants (Date.now()) at which the successful take()
// calls were made — the same synchronous step in which the limiter reads the
// clock for its decision.
import { Redis } from "@upstash/redis";
import { upstashRateLimiter } from "../src/limits/upstash.ts";

const [url, token, prefix, key, rate, perMs, startAt, durationMs, loops] = process.argv.slice(2);
if (!url || !token || !prefix || !key || !rate || !perMs || !startAt || !durationMs || !loops) {
  console.error("usage: upstash-limit-worker.ts URL TOKEN PREFIX KEY RATE PER_MS START_AT DURATION_MS LOOPS");
  process.exit(2);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
const limiter = upstashRateLimiter({ redis: new Redis({ url, token, retry: false }), prefix });
const bucket = { key, rate: Number(rate), perMs: Number(perMs) };
const end = Number(startAt) + Number(durationMs);
const stamps: number[] = [];
const errors: string[] = [];
let refused = 0;

await sleep(Number(startAt) - Date.now());
await Promise.all(
  Array.from({ length: Number(loops) }, async () => {
    while (Date.now() < end) {
      const stamp = Date.now();
      try {
        const result = await limiter.take([bucket]);
        if (result.ok) {
          stamps.push(stamp);
        } else {
          refused += 1;
          await sleep(Math.min(result.retryAfterMs, end - Date.now()));
        }
      } catch (error) {
        errors.push(error instanceof Error ? error.message : String(error));
        await sleep(50);
      }
    }
  }),
);
console.log(`DONE ${JSON.stringify({ stamps, refused, errors })}`);
process.exit(0);
