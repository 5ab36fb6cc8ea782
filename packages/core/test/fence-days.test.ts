import { expect, test } from "vitest";
import { waitPastDayEdge } from "./fence-days.ts";

test("a partition test waits out UTC midnight and 23:00 when either is less than the margin ahead, else not", () => {
  const at = (time: string) => Date.parse(`2026-12-02T${time}Z`);
  expect(waitPastDayEdge(at("23:59:30"), 60_000)).toBe(32_000);
  expect(waitPastDayEdge(at("22:59:59.500"), 60_000)).toBe(2_500);
  expect(waitPastDayEdge(at("23:58:59"), 60_000)).toBe(0);
  expect(waitPastDayEdge(at("00:00:00"), 60_000)).toBe(0);
  expect(waitPastDayEdge(at("23:00:00"), 60_000)).toBe(0);
  expect(waitPastDayEdge(at("12:00:00"), 60_000)).toBe(0);
});
