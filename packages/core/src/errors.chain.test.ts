// Errors read through what they wrap (#9 item 7), through the real harness
// on real Postgres: real undici fetch failures, a real AggregateError from
// Promise.any, an error shaped like AWS SDK v3's ThrottlingException.

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { useTestDatabase } from "@softcrum/testing";
import { eq } from "drizzle-orm";
import { afterEach, beforeAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { silentLogger } from "../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "./consumer.ts";
import { deadLetters, LAST_ERROR_MAX } from "./db/schema.ts";
import { createEnvelope } from "./envelope.ts";
import { PermanentError } from "./errors.ts";

const pg = useTestDatabase("errors_chain");

afterEach(async () => {
  await pg.sql`truncate core.dead_letters, core.processed_jobs cascade`;
});

/** A loopback port that was just closed: connecting to it is refused at once. */
let port = 0;
let CLOSED = "";
beforeAll(async () => {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  port = (server.address() as AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  CLOSED = `http://127.0.0.1:${port}/`;
});

/** An error shaped exactly as AWS SDK v3 throws a throttled call (no SDK needed). */
class ThrottlingException extends Error {
  readonly $fault = "client";
  readonly $metadata = {
    httpStatusCode: 429,
    requestId: "7f2c4b1e-0000-4000-8000-000000000001",
    attempts: 3,
    totalRetryDelay: 412,
  };
  readonly $retryable = { throttling: true };
  readonly Message = "Rate exceeded";
  constructor() {
    super("Rate exceeded");
    this.name = "ThrottlingException";
  }
}

let seq = 0;
function run(handle: () => Promise<void>) {
  seq += 1;
  const consumer = defineConsumer({
    name: `chain.c${seq}`,
    queue: `chain.q${seq}`,
    kind: "chain.v1",
    schema: z.object({}),
    handle,
  });
  const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger, random: () => 0.5 });
  const body = JSON.stringify(createEnvelope({ tenantId: "acme", kind: "chain.v1", data: {} }));
  return {
    /** One delivery, `deliveryCount` 5: the last attempt of the default policy. */
    deliver: (deliveryCount = 5) => bound.deliver({ body, deliveryCount }),
    letters: () => pg.db.select().from(deadLetters).where(eq(deadLetters.consumer, consumer.name)),
  };
}

describe("a dead letter's last_error keeps the chain (#9 item 7)", () => {
  test("a real fetch to a closed port dead-letters with its cause: fetch failed ← caused by ECONNREFUSED (#9 item 7)", async () => {
    const job = run(async () => {
      await fetch(CLOSED);
    });
    expect(await job.deliver()).toMatchObject({ outcome: "dead_lettered", errorClass: "exhausted" });
    const [letter] = await job.letters();
    expect(letter?.lastError).toBe(
      `TypeError: fetch failed ← caused by Error: connect ECONNREFUSED 127.0.0.1:${port} (code ECONNREFUSED)`,
    );
  });

  test("a real AggregateError from Promise.any dead-letters with every member and its cause (#9 item 7)", async () => {
    const job = run(async () => {
      await Promise.any([fetch(CLOSED), Promise.reject(new Error("mirror b: 503 Service Unavailable"))]);
    });
    expect(await job.deliver()).toMatchObject({ outcome: "dead_lettered", errorClass: "exhausted" });
    const [letter] = await job.letters();
    expect(letter?.lastError).toBe(
      `AggregateError: All promises were rejected [2 errors: (1) TypeError: fetch failed ← caused by Error: connect ECONNREFUSED 127.0.0.1:${port} (code ECONNREFUSED); (2) Error: mirror b: 503 Service Unavailable]`,
    );
  });

  test("a cause cycle ends: the letter is written with each error once (#9 item 7)", async () => {
    const job = run(async () => {
      const outer = new Error("sync failed");
      const inner = new Error("partner unreachable", { cause: outer });
      outer.cause = inner;
      throw outer;
    });
    expect(await job.deliver()).toMatchObject({ outcome: "dead_lettered", errorClass: "exhausted" });
    const [letter] = await job.letters();
    expect(letter?.lastError).toBe("Error: sync failed ← caused by Error: partner unreachable ← caused by (cycle)");
  });

  test("a chain longer than the column holds is cut to LAST_ERROR_MAX, and the letter is written (#9 item 7)", async () => {
    const job = run(async () => {
      let error = new Error(`level 0 ${"x".repeat(1500)}`);
      for (let i = 1; i < 50; i++) error = new Error(`level ${i} ${"y".repeat(1500)}`, { cause: error });
      throw error;
    });
    expect(await job.deliver()).toMatchObject({ outcome: "dead_lettered" });
    const [letter] = await job.letters();
    expect(letter?.lastError.length).toBeLessThanOrEqual(LAST_ERROR_MAX);
    expect(letter?.lastError).toContain("← caused by Error: level 48");
  });

  test("a PermanentError inside the chain dead-letters at once as permanent (#9 item 7)", async () => {
    const job = run(async () => {
      throw new Error("award failed", { cause: new PermanentError("account closed") });
    });
    expect(await job.deliver(1)).toMatchObject({ outcome: "dead_lettered", errorClass: "permanent" });
    const [letter] = await job.letters();
    expect(letter?.lastError).toBe("Error: award failed ← caused by PermanentError: account closed");
  });
});

describe("a rate limit anywhere in the chain never dead-letters (#9 item 7)", () => {
  const limited = { outcome: "rate_limited", ack: false, spendsAttempt: false };

  test("an AWS SDK v3 ThrottlingException on the last attempt is rate limited, however often it comes (#9 item 7)", async () => {
    const job = run(async () => {
      throw new ThrottlingException();
    });
    for (let i = 0; i < 3; i++) expect(await job.deliver(5)).toMatchObject(limited);
    expect(await job.letters()).toEqual([]);
  });

  test("a ThrottlingException wrapped by the handler, and one inside Promise.any's AggregateError, are rate limited (#9 item 7)", async () => {
    const wrapped = run(async () => {
      try {
        throw new ThrottlingException();
      } catch (thrown) {
        throw new Error("dynamodb put failed", { cause: thrown });
      }
    });
    const any = run(async () => {
      await Promise.any([fetch(CLOSED), Promise.reject(new ThrottlingException())]);
    });
    expect(await wrapped.deliver()).toMatchObject(limited);
    expect(await any.deliver()).toMatchObject(limited);
    expect(await wrapped.letters()).toEqual([]);
    expect(await any.letters()).toEqual([]);
  });

  test("a 429 two causes deep keeps its Retry-After, from a header or a fetch Response (#9 item 7)", async () => {
    const fromHeaders = run(async () => {
      const http = Object.assign(new Error("Too Many Requests"), { status: 429, headers: { "retry-after": "7" } });
      throw new Error("sync failed", { cause: new Error("partner call failed", { cause: http }) });
    });
    const fromResponse = run(async () => {
      const response = new Response(null, { status: 429, headers: { "Retry-After": "9" } });
      throw new Error("partner call failed", { cause: Object.assign(new Error("HTTP 429"), { response }) });
    });
    expect(await fromHeaders.deliver()).toMatchObject({ ...limited, retryAfterMs: 7_000 });
    expect(await fromResponse.deliver()).toMatchObject({ ...limited, retryAfterMs: 9_000 });
    expect(await fromHeaders.letters()).toEqual([]);
    expect(await fromResponse.letters()).toEqual([]);
  });
});
