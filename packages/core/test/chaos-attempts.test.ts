/**
 * The chaos run's "attempts never above handler runs" check (chaos/attempts.ts)
 * on records a batched worker writes: a batch's handlers run in the async
 * context of the delivery that completed the batch, so their `run` records
 * carry that delivery's number, which may be another job's. A job whose own
 * delivery was killed before its handler ran must still be credited `killed`
 * (CI run of seed 856440808: one such job was reported as attempt 2 at its
 * first run).
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { checkAttempts } from "../chaos/attempts.ts";
import type { DeliveryRecord } from "../chaos/consumer.ts";
import type { BrokerEvent } from "../chaos/hostile-broker.ts";
import type { FakeVercelQueues } from "./fake-vercel-queues.ts";

const X = "01a23848-ddf0-7349-bf92-615f9dcb1f95"; // killed in a batch before its handler ran
const Y = "01a23848-c5a8-7315-b30a-69fe024e3f2e";
const Z = "01a23848-df98-749f-a818-227203f20db0";
const body = (jobId: string) => Buffer.from(JSON.stringify({ job_id: jobId }));

function records(dir: string, file: string, lines: DeliveryRecord[]): string {
  const path = join(dir, file);
  writeFileSync(path, lines.map((line) => `${JSON.stringify(line)}\n`).join(""));
  return path;
}

describe("checkAttempts", () => {
  test("a run numbered with another job's delivery does not hide that delivery's kill: the killed job is credited, not over its runs", () => {
    const dir = mkdtempSync(join(tmpdir(), "chaos-attempts-"));
    const first = records(dir, "worker-1.1.jsonl", [
      { e: "recv", d: 149, t: 100, job: Y, msg: "mY", n: 1 },
      { e: "recv", d: 150, t: 101, job: X, msg: "mX", n: 1 },
      { e: "recv", d: 151, t: 101, job: Z, msg: "mZ", n: 1 },
      // The batch's handlers ran in delivery 150's context: X's number, Y's and Z's runs.
      { e: "run", d: 150, t: 102, job: Y, a: 1 },
      { e: "run", d: 150, t: 102, job: Z, a: 1 },
    ]);
    records(dir, "worker-0.2.jsonl", [
      { e: "recv", d: 266, t: 200, job: X, msg: "mX", n: 2 },
      { e: "run", d: 266, t: 201, job: X, a: 2 },
      { e: "end", d: 266, t: 202, o: "success" },
    ]);
    const fake = {
      sends: [
        { messageId: "mX", body: body(X) },
        { messageId: "mY", body: body(Y) },
        { messageId: "mZ", body: body(Z) },
      ],
    } as unknown as FakeVercelQueues;
    const events: BrokerEvent[] = [
      { at: 90, type: "received", messageId: "mY", client: "1.1" },
      { at: 100, type: "received", messageId: "mX", client: "1.1" },
      { at: 100, type: "received", messageId: "mZ", client: "1.1" },
      { at: 199, type: "received", messageId: "mX", client: "0.2" },
    ];
    const verdict = checkAttempts(fake, events, dir, new Map([[first, 150]]));
    expect(verdict.credits).toEqual({ killed: 1 });
    expect(verdict.overJobIds).toEqual([]);
    expect(verdict.problems).toEqual([]);
  });
});
