// The Upstash rate limiter (#20 item 1, ADR 0010) through the real
// `@upstash/redis` client, against a loopback REST shim in front of the local
// Redis (test/upstash-shim.ts). Every test writes under its own prefix, and
// the keys of the run are deleted at the end.
//
// "Success timestamps" below are the instants at which successful take()
// calls were made: the limiter reads the clock for its decision in the same
// synchronous step (a token's decision instant). Windows are sliding,
// half-open: [t, t + 1 s).
import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Redis } from "@upstash/redis";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { startUpstashShim, type UpstashShim } from "../../test/upstash-shim.ts";
import type { TokenBucket } from "./port.ts";
import { RateLimiterUnavailableError, upstashIntervalMs, upstashRateLimiter } from "./upstash.ts";

let shim: UpstashShim;
const run = `softcrum-test:limits:${randomUUID()}`;
let tests = 0;
/** A prefix of its own for every limiter a test makes. */
const freshPrefix = () => `${run}:${++tests}`;
const client = () => new Redis({ url: shim.url, token: shim.token, retry: false });
const limiter = (options: { timeoutMs?: number } = {}) =>
  upstashRateLimiter({ redis: client(), prefix: freshPrefix(), ...options });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** The most timestamps in any half-open window [t, t + windowMs). */
function mostInAnyWindow(stamps: readonly number[], windowMs: number): number {
  const sorted = [...stamps].sort((a, b) => a - b);
  let most = 0;
  let first = 0;
  for (const [last, stamp] of sorted.entries()) {
    while (stamp - (sorted[first] as number) >= windowMs) first += 1;
    most = Math.max(most, last - first + 1);
  }
  return most;
}

beforeAll(async () => {
  shim = await startUpstashShim();
});

afterEach(() => {
  shim.down(false);
  shim.hang(false);
});

afterAll(async () => {
  if (!shim) return;
  await shim.deleteKeys(`${run}:*`);
  await shim.close();
});

describe("the REST shim", () => {
  test("answers what the real client decodes: base64 strings at every depth, OK, errors, and the Lua flag", async () => {
    const redis = client();
    const key = `${run}:shim`;
    expect(await redis.set(key, "héllo")).toBe("OK");
    expect(await redis.get(key)).toBe("héllo");
    const piped = await redis.pipeline().set(`${key}:a`, "x").get(`${key}:a`).mget(key, `${key}:none`).exec();
    expect(piped).toEqual(["OK", "x", ["héllo", null]]);
    const atomic = await redis.multi().set(`${key}:b`, "y").incr(`${key}:n`).get(`${key}:b`).exec();
    expect(atomic).toEqual(["OK", 1, "y"]);
    expect(await redis.eval("return {ARGV[1], {'OK', 7}}", [], ["nested"])).toEqual(["nested", ["OK", 7]]);
    await expect(redis.incr(key)).rejects.toThrow(/not an integer/);
    // Upstash's key-locking flag: EVAL strips it, EVALSHA of the original SHA still hits.
    const flagged = "#!lua flags=allow-key-locking\nreturn redis.call('GET', KEYS[1])";
    expect(await redis.eval(flagged, [key], [])).toBe("héllo");
    expect(await redis.evalsha(createHash("sha1").update(flagged).digest("hex"), [key], [])).toBe("héllo");
    await expect(new Redis({ url: shim.url, token: "wrong", retry: false }).get(key)).rejects.toThrow(/Unauthorized/);
  });
});

describe("upstashRateLimiter", () => {
  test("a bucket of 10/s: 30 concurrent takes get one token; no sliding second ever holds more than 10", async () => {
    const limits = limiter();
    const bucket: TokenBucket = { key: "provider:burst", rate: 10, perMs: 1_000 };
    const stamps: number[] = [];
    const takeStamped = async () => {
      const stamp = Date.now();
      const result = await limits.take([bucket]);
      if (result.ok) stamps.push(stamp);
      return result;
    };

    const first = await Promise.all(Array.from({ length: 30 }, takeStamped));
    expect(first.filter((result) => result.ok)).toHaveLength(1); // size 1: no burst
    for (const result of first) {
      if (!result.ok) {
        expect(result.bucket).toBe("provider:burst");
        expect(result.retryAfterMs).toBeGreaterThanOrEqual(1);
        expect(result.retryAfterMs).toBeLessThanOrEqual(upstashIntervalMs(bucket));
      }
    }

    // 30 callers keep taking for 2.2 s, each waiting out its retryAfterMs.
    const end = Date.now() + 2_200;
    await Promise.all(
      Array.from({ length: 30 }, async () => {
        while (Date.now() < end) {
          const result = await takeStamped();
          if (!result.ok) await sleep(Math.min(result.retryAfterMs, end - Date.now()));
        }
      }),
    );
    expect(mostInAnyWindow(stamps, 1_000)).toBeLessThanOrEqual(10);
    expect(stamps.length).toBeGreaterThanOrEqual(18); // the rate is used, not wasted
  });

  test("all or none: a refusing provider bucket leaves the tenant's token, and the tenant bucket never holds more than one", async () => {
    const limits = limiter();
    const tenant: TokenBucket = { key: "tenant:mail:t1", rate: 1, perMs: 60_000 };
    const provider: TokenBucket = { key: "provider:mail", rate: 1, perMs: 60_000 };

    expect(await limits.take([provider])).toEqual({ ok: true }); // drain the provider
    for (let i = 0; i < 2; i++) {
      const refused = await limits.take([tenant, provider]);
      expect(refused).toMatchObject({ ok: false, bucket: "provider:mail" });
      if (!refused.ok) {
        expect(refused.retryAfterMs).toBeGreaterThan(55_000);
        expect(refused.retryAfterMs).toBeLessThanOrEqual(upstashIntervalMs(provider));
      }
    }
    // The tenant gave nothing (it holds its one token), and two refusals did not give it two.
    expect(await limits.take([tenant])).toEqual({ ok: true });
    expect(await limits.take([tenant])).toMatchObject({ ok: false, bucket: "tenant:mail:t1" });

    // The other way round: an empty tenant bucket takes nothing from the provider's.
    const otherProvider: TokenBucket = { key: "provider:sms", rate: 1, perMs: 60_000 };
    expect(await limits.take([tenant, otherProvider])).toMatchObject({ ok: false, bucket: "tenant:mail:t1" });
    expect(await limits.take([otherProvider])).toEqual({ ok: true });
  });

  test("block(): takes wait it out, a shorter later block does not shorten it, and takes succeed after it", async () => {
    const limits = limiter();
    const bucket: TokenBucket = { key: "provider:429", rate: 100, perMs: 1_000 };
    const other: TokenBucket = { key: "tenant:429:t1", rate: 100, perMs: 1_000 };

    await limits.block(bucket, 1_000);
    const refused = await limits.take([other, bucket]);
    expect(refused).toMatchObject({ ok: false, bucket: "provider:429" });
    if (!refused.ok) {
      expect(refused.retryAfterMs).toBeGreaterThan(800);
      expect(refused.retryAfterMs).toBeLessThanOrEqual(1_000);
    }
    // Nothing was taken from the other bucket of that take.
    expect(await limits.take([other])).toEqual({ ok: true });

    await limits.block(bucket, 100);
    const still = await limits.take([bucket]);
    expect(still).toMatchObject({ ok: false, bucket: "provider:429" });
    if (!still.ok) {
      expect(still.retryAfterMs).toBeGreaterThan(600);
      await sleep(still.retryAfterMs + 20);
    }
    expect(await limits.take([bucket])).toEqual({ ok: true });
  });

  test("an outage is an error, never a pass: 503 and a hanging Upstash both throw; takes succeed when it is back", async () => {
    const timeoutMs = 500;
    const limits = limiter({ timeoutMs });
    const bucket: TokenBucket = { key: "provider:outage", rate: 100, perMs: 1_000 };

    shim.down(true);
    await expect(limits.take([bucket])).rejects.toBeInstanceOf(RateLimiterUnavailableError);
    await expect(limits.block(bucket, 1_000)).rejects.toBeInstanceOf(RateLimiterUnavailableError);
    shim.down(false);
    expect(await limits.take([bucket])).toEqual({ ok: true });

    shim.hang(true);
    const startedAt = Date.now();
    await expect(limits.take([bucket])).rejects.toThrow(/no answer from Upstash within 500 ms/);
    expect(Date.now() - startedAt).toBeLessThan(timeoutMs + 1_000);
    shim.hang(false);
    await sleep(20); // a token every 10.5 ms
    expect(await limits.take([bucket])).toEqual({ ok: true });
  });

  test("three worker processes sharing one provider bucket of 10/s: no sliding second holds more than 10", async () => {
    const prefix = freshPrefix();
    const script = fileURLToPath(new URL("../../test/upstash-limit-worker.ts", import.meta.url));
    const startAt = Date.now() + 1_500; // after the three have loaded
    const durationMs = 3_000;
    const children: ChildProcess[] = [];
    try {
      const outputs = await Promise.all(
        [1, 2, 3].map((n) => {
          const child = spawn(
            process.execPath,
            [
              "--import",
              "tsx",
              script,
              shim.url,
              shim.token,
              prefix,
              "provider:shared",
              "10",
              "1000",
              String(startAt),
              String(durationMs),
              "4",
            ],
            { cwd: fileURLToPath(new URL("../..", import.meta.url)), stdio: ["ignore", "pipe", "pipe"] },
          );
          children.push(child);
          let output = "";
          let errors = "";
          child.stdout?.on("data", (chunk) => {
            output += chunk;
          });
          child.stderr?.on("data", (chunk) => {
            errors += chunk;
          });
          return new Promise<{ stamps: number[]; refused: number; errors: string[] }>((resolve, reject) => {
            child.on("exit", (code) => {
              const line = output.split("\n").find((l) => l.startsWith("DONE "));
              if (code === 0 && line) resolve(JSON.parse(line.slice("DONE ".length)));
              else reject(new Error(`worker ${n} exited (${code}): ${output}${errors}`));
            });
          });
        }),
      );
      for (const output of outputs) {
        expect(output.errors).toEqual([]);
        expect(output.stamps.length).toBeGreaterThan(0); // every process got tokens
      }
      const stamps = outputs.flatMap((output) => output.stamps);
      expect(mostInAnyWindow(stamps, 1_000)).toBeLessThanOrEqual(10);
      expect(stamps.length).toBeGreaterThanOrEqual(20);
    } finally {
      for (const child of children) child.kill("SIGKILL");
    }
  }, 20_000);
});
