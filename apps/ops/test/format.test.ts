import type { BatchView } from "@softcrum/core/ops";
import { describe, expect, test } from "vitest";
import { humanBatch } from "../src/batch-run.ts";
import {
  age,
  duration,
  etaText,
  fields,
  humanMs,
  nameFlags,
  ProgressLines,
  phaseOf,
  prettyPayload,
  relative,
  table,
  when,
} from "../src/format.ts";
import { replayOutcomeLine } from "../src/output.ts";

describe("readable output (#10 item 13)", () => {
  test.each([
    [0, "0ms"],
    [850, "850ms"],
    [42_000, "42s"],
    [185_000, "3m 5s"],
    [11_520_000, "3h 12m"],
    [3 * 3_600_000, "3h"],
    [2 * 86_400_000 + 4 * 3_600_000, "2d 4h"],
  ])("duration(%i) is %s", (ms, text) => {
    expect(duration(ms)).toBe(text);
  });

  test("ages say how long ago", () => {
    const now = Date.parse("2026-11-30T12:00:00Z");
    expect(age(new Date("2026-11-30T08:48:00Z"), now)).toBe("3h 12m ago");
    expect(age(null, now)).toBe("");
  });

  test("a table fits the width, cutting the widest cells with … but never an id; wide keeps every cell", () => {
    const rows = [
      { id: "01a22bed-d570-71be-8a14-720f35278901", consumer: "loyalty.notify-partner", lastError: "x".repeat(200) },
    ];
    const fitted = table(rows, ["id", "consumer", "lastError"], { width: 80 });
    for (const line of fitted.split("\n")) expect(line.length).toBeLessThanOrEqual(80);
    expect(fitted).toContain("01a22bed-d570-71be-8a14-720f35278901");
    expect(fitted).toContain("…");
    const wide = table(rows, ["id", "consumer", "lastError"], { width: 80, wide: true });
    expect(wide).toContain("x".repeat(200));
    expect(fields({ reason: "y".repeat(300) }, ["reason"], { width: 60 }).length).toBeLessThanOrEqual(60);
  });

  test("when even cut cells do not fit, the last columns are left out and the table says so", () => {
    const row = Object.fromEntries(["id", "a", "b", "c", "d", "e", "f"].map((c) => [c, `${c}-${"v".repeat(30)}`]));
    row["id"] = "01a22bed-d570-71be-8a14-720f35278901";
    const fitted = table([row], ["id", "a", "b", "c", "d", "e", "f"], { width: 70 });
    for (const line of fitted.split("\n")) expect(line.length, line).toBeLessThanOrEqual(70);
    expect(fitted).toContain("01a22bed-d570-71be-8a14-720f35278901");
    expect(fitted).toMatch(/\(.*f left out to fit 70 columns: --wide shows all\)/);
  });

  test("errors name the flags typed, not the library's fields", () => {
    expect(nameFlags("invalid filter: createdAfter: must be a date/time", { createdAfter: "--created-after" })).toBe(
      "invalid input: --created-after: must be a date/time",
    );
    expect(
      nameFlags("invalid filter: envelope: createdAfter must be before createdBefore", {
        createdAfter: "--since",
        createdBefore: "--until",
      }),
    ).toMatch(/--since must be before --until/);
    expect(nameFlags("invalid batch: ratePerSecond: Too small", { ratePerSecond: "--rate" })).toBe(
      "invalid input: --rate: Too small",
    );
  });

  test("a JSON payload is pretty-printed; anything else is shown as received", () => {
    expect(prettyPayload('{"a":1,"b":[2]}')).toBe('{\n  "a": 1,\n  "b": [\n    2\n  ]\n}');
    expect(prettyPayload("{garbage")).toBe("{garbage");
  });

  test("the progress says when it waits for the sample check, and when it is paced", () => {
    const batch = {
      status: "running",
      sampleSize: 5,
      samplePassedAt: null,
      selected: 100,
      replayed: 5,
      skipped: 0,
      succeeded: 2,
      failedAgain: 0,
      ratePerSecond: 25,
    };
    expect(phaseOf(batch)).toBe("waiting for the sample check (2 of 5 resolved)");
    expect(phaseOf({ ...batch, replayed: 3 })).toBe("paced at 25/s");
    expect(phaseOf({ ...batch, samplePassedAt: new Date(), replayed: 40 })).toBe("paced at 25/s");
    expect(phaseOf({ ...batch, status: "paused" })).toBe("paused");
  });
});

describe("progress without a terminal (#21 item 8)", () => {
  test("a line at the start, every 10 % or 10 s, and the latest at the end — not one a second", () => {
    const lines: string[] = [];
    let now = 0;
    const progress = new ProgressLines((line) => lines.push(line), { now: () => now });
    const payload = { rate: "1.0", etaText: "1m", failedAgain: 0, phase: "paced at 1/s" };
    // 600 letters at 1/s, an update a second: 10 minutes.
    for (let done = 0; done <= 600; done++) {
      progress.update(600, done, payload);
      now += 1_000;
    }
    progress.finish();
    // Every 10 s (before 10 % = 60 letters): 61 lines, not 601.
    expect(lines.length).toBe(61);
    expect(lines[0]).toBe("replay 0/600 | 1.0/s | ETA 1m | failed again 0 | paced at 1/s");
    expect(lines.at(-1)).toMatch(/^replay 600\/600 /);

    const fast: string[] = [];
    now = 0;
    const quick = new ProgressLines((line) => fast.push(line), { now: () => now });
    for (let done = 0; done <= 1_000; done += 5) {
      quick.update(1_000, done, payload);
      now += 50;
    }
    quick.finish();
    // Every 10 % of the letters (100) within 10 s: the start, 10 steps, and no extra end line.
    expect(fast.map((line) => line.split(" ")[1])).toEqual([
      "0/1000",
      "100/1000",
      "200/1000",
      "300/1000",
      "400/1000",
      "500/1000",
      "600/1000",
      "700/1000",
      "800/1000",
      "900/1000",
      "1000/1000",
    ]);
  });
});

describe("tables sized by content (#21 item 9)", () => {
  test("at 110 columns the error gives way: queue names, classes and ids stay whole; a cut keeps both ends", () => {
    const rows = [
      {
        id: "01a22bed-d570-71be-8a14-720f35278901",
        queue: "loyalty.award-points",
        errorClass: "permanent",
        lastError: `customer c-closed is closed: ${"detail ".repeat(30)}(SQLSTATE 23514)`,
      },
      {
        id: "01a22bed-d570-71be-8a14-720f35278902",
        queue: "loyalty.partner-notifications",
        errorClass: "exhausted",
        lastError: "ETIMEDOUT",
      },
    ];
    const fitted = table(rows, ["id", "queue", "errorClass", "lastError"], { width: 110 });
    for (const line of fitted.split("\n")) expect(line.length, line).toBeLessThanOrEqual(110);
    for (const whole of [
      "loyalty.award-points",
      "loyalty.partner-notifications",
      "permanent",
      "exhausted",
      "ETIMEDOUT",
    ]) {
      expect(fitted).toContain(whole);
    }
    expect(fitted).toMatch(/customer c-\S*…\S* 23514\)/);
  });

  test("when the error is at its narrowest, other columns are elided in the middle, never an id", () => {
    const row = {
      id: "01a22bed-d570-71be-8a14-720f35278901",
      queue: "loyalty.award-points",
      lastError: "e".repeat(80),
    };
    const fitted = table([row], ["id", "queue", "lastError"], { width: 76 });
    for (const line of fitted.split("\n")) expect(line.length, line).toBeLessThanOrEqual(76);
    expect(fitted).toContain(row.id);
    expect(fitted).toMatch(/loyalty\.\S*…\S*points/);
  });
});

describe("durations and ages in human units, never milliseconds (#21 item 8)", () => {
  const now = Date.parse("2026-11-30T12:00:00Z");

  test.each([
    [192_000, "3m 12s"],
    [2 * 3_600_000 + 5 * 60_000, "2h 5m"],
    [4 * 86_400_000 + 3 * 3_600_000, "4d 3h"],
    [60_000, "1m"],
    [86_400_000, "1d"],
    [59_999, "59s"],
    [-5, "0ms"],
    [Number.NaN, "?"],
  ])("duration(%d) is %s", (ms, text) => {
    expect(duration(ms)).toBe(text);
  });

  test("a time relative to now, either way, with its timestamp beside it", () => {
    expect(relative(new Date(now - 192_000), now)).toBe("3m 12s ago");
    expect(relative(new Date(now + 2 * 3_600_000 + 5 * 60_000), now)).toBe("in 2h 5m");
    expect(relative("2026-11-26T09:00:00Z", now)).toBe("4d 3h ago");
    expect(relative(null, now)).toBe("");
    expect(when(new Date(now - 192_000), now)).toBe("3m 12s ago (2026-11-30T11:56:48Z)");
    expect(when(new Date(now + 60_000), now)).toBe("in 1m (2026-11-30T12:01:00Z)");
    expect(when(undefined, now)).toBe("");
    expect(age("not a time", now)).toBe("");
  });

  test("the library's millisecond counts read in human units; other text stays as typed", () => {
    expect(humanMs("sample: 1 of 2 sample jobs did not resolve within 600000 ms")).toBe(
      "sample: 1 of 2 sample jobs did not resolve within 10m",
    );
    expect(humanMs("the transport did not answer the replay's publish within 10000 ms; replay it again")).toBe(
      "the transport did not answer the replay's publish within 10s; replay it again",
    );
    expect(humanMs("stopped by ana: latency at 900 ms, retry after 5000 ms")).toBe(
      "stopped by ana: latency at 900 ms, retry after 5000 ms",
    );
  });

  test("an ETA in whole seconds and up, never in ms; a paced rate without a long fraction", () => {
    expect(etaText(0)).toBe("0s");
    expect(etaText(0.2)).toBe("1s");
    expect(etaText(191.2)).toBe("3m 12s");
    expect(etaText(4 * 86_400 + 3 * 3_600)).toBe("4d 3h");
    expect(etaText(Number.POSITIVE_INFINITY)).toBe("?");
    const running = {
      status: "running",
      sampleSize: null,
      samplePassedAt: null,
      selected: 10,
      replayed: 1,
      skipped: 0,
      succeeded: 1,
      failedAgain: 0,
    };
    expect(phaseOf({ ...running, ratePerSecond: 10 / 3 })).toBe("paced at 3.333/s");
    expect(phaseOf({ ...running, ratePerSecond: 0.001 })).toBe("paced at 0.001/s");
    expect(phaseOf({ ...running, ratePerSecond: 1000 })).toBe("paced at 1000/s");
  });

  test("a record's ids are never cut, whatever the width", () => {
    const record = {
      id: "01a22bed-d570-71be-8a14-720f35278901",
      jobId: "01a22bed-d570-71be-8a14-720f35278902",
      replayBatchId: "01a22bed-d570-71be-8a14-720f35278903",
      reason: "r".repeat(100),
    };
    const shown = fields(record, ["id", "jobId", "replayBatchId", "reason"], { width: 40 });
    for (const id of [record.id, record.jobId, record.replayBatchId]) expect(shown).toContain(id);
    expect(shown).toContain("…");
    const related = table([{ ...record, age: "3m ago" }], ["id", "age", "replayBatchId", "reason"], { width: 90 });
    expect(related).toContain(record.replayBatchId);
  });

  test("a batch for people: its times as ages and durations beside the timestamps, its lease, no raw ms", () => {
    const at = (offsetMs: number) => new Date(now + offsetMs);
    const batch = {
      id: "01a22bed-d570-71be-8a14-720f35278901",
      status: "running",
      createdAt: at(-3 * 3_600_000),
      approvedAt: at(-2 * 3_600_000 - 5 * 60_000),
      startedAt: at(-192_000),
      endedAt: null,
      expiresAt: at(4 * 86_400_000 + 3 * 3_600_000),
      leaseOwner: "ana@host:42:abcd1234",
      leaseExpiresAt: at(25_000),
      stopReason: null,
      recovered: false,
      timeToRecoveryMs: null,
      succeeded: 1,
      duplicates: 0,
      failedAgain: 0,
      unresolved: 2,
      pending: 7,
    } as unknown as BatchView;
    expect(humanBatch(batch, now)).toMatchObject({
      created: "3h ago (2026-11-30T09:00:00Z)",
      approved: "2h 5m ago (2026-11-30T09:55:00Z)",
      started: "3m 12s ago (2026-11-30T11:56:48Z)",
      ended: "",
      ran: "3m 12s so far",
      expires: "in 4d 3h (2026-12-04T15:00:00Z)",
      lease: "ana@host:42:abcd1234, expires in 25s",
      recovery: "not yet: 2 replayed jobs unresolved, 7 letters to replay",
    });
    const over = humanBatch(
      {
        ...batch,
        status: "paused",
        approvedAt: null,
        endedAt: at(-60_000),
        expiresAt: at(-30_000),
        leaseExpiresAt: at(-45_000),
        stopReason: "sample: 1 of 1 sample jobs did not resolve within 600000 ms",
        recovered: true,
        timeToRecoveryMs: 125_000,
        unresolved: 0,
        pending: 0,
      },
      now,
    );
    expect(over).toMatchObject({
      approved: "",
      ended: "1m ago (2026-11-30T11:59:00Z)",
      ran: "2m 12s",
      expires: "expired 30s ago (2026-11-30T11:59:30Z)",
      lease: "ana@host:42:abcd1234, lapsed 45s ago: another runner may take over",
      stopReason: "sample: 1 of 1 sample jobs did not resolve within 10m",
      recovery: "done: 1 succeeded, 0 already done, 0 failed again in 2m 5s",
    });
    expect(humanBatch({ ...batch, startedAt: null, leaseOwner: null, leaseExpiresAt: null }, now)).toMatchObject({
      started: "not yet",
      ran: "not yet",
      lease: "none",
    });
  });
});

describe("what replayed jobs did so far (#21 item 9)", () => {
  test("one line of counts, and where to look again", () => {
    expect(replayOutcomeLine([{ id: "a", outcome: "succeeded" }])).toBe(
      "so far: 1 succeeded, 0 already done, 0 failed again, 0 not yet",
    );
    expect(
      replayOutcomeLine([
        { id: "a", outcome: "not_yet" },
        { id: "b", outcome: "failed_again" },
      ]),
    ).toBe(
      "so far: 0 succeeded, 0 already done, 1 failed again, 1 not yet (look again: pnpm ops dlq show a) — see pnpm ops dlq failed-after-replay",
    );
  });
});
