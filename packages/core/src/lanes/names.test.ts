import { expect, test } from "vitest";
import { InvalidConfigError } from "../errors.ts";
import { laneQueue, parseLaneQueue } from "./names.ts";

test("lane queues are named one way and read back; anything else is refused or not a lane", () => {
  expect(laneQueue("email", "transactional")).toBe("notif.email.transactional");
  expect(laneQueue("push-web", "marketing")).toBe("notif.push-web.marketing");
  expect(parseLaneQueue("notif.email.marketing")).toEqual({ channel: "email", lane: "marketing" });
  expect(parseLaneQueue(laneQueue("sms", "transactional"))).toEqual({ channel: "sms", lane: "transactional" });
  for (const q of [
    "notif.email.bulk",
    "notif.Email.marketing",
    "loyalty.points",
    "notif..marketing",
    "notif.email.marketing.x",
  ]) {
    expect(parseLaneQueue(q)).toBeUndefined();
  }
  for (const bad of [
    () => laneQueue("E-mail", "marketing"),
    () => laneQueue("", "marketing"),
    () => laneQueue("email", "bulk" as never),
  ]) {
    expect(bad).toThrow(InvalidConfigError);
  }
});
