import { describe, expect, test } from "vitest";
import { award } from "../../../test/points-fixture.ts";
import { useVercelHarnesses } from "../../../test/vercel-transport.ts";
import { InvalidConfigError } from "../../errors.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { fromVercelTopic, toVercelTopic } from "./topics.ts";

const open = useVercelHarnesses();

describe("names", () => {
  test("platform queue names map reversibly to Vercel topic names", () => {
    expect(toVercelTopic("notif.email.transactional")).toBe("notif_Demail_Dtransactional");
    expect(toVercelTopic("loyalty:points_v2-x")).toBe("loyalty_3Apoints__v2-x");
    for (const name of ["a", "a.b", "a_b", "a__b", "a._b", "a_.b", "_D", "a:b.c_d-e", "x_3A", "DD.__::"]) {
      const topic = toVercelTopic(name);
      expect(topic).toMatch(/^[A-Za-z0-9_-]+$/);
      expect(fromVercelTopic(topic)).toBe(name);
    }
    expect(toVercelTopic("a.b")).not.toBe(toVercelTopic("a_b"));
    expect(() => fromVercelTopic("a_Xb")).toThrow(InvalidConfigError);
  });

  test("a name that cannot be mapped is refused when binding a consumer or publishing to it", async () => {
    const h = await open("push");
    const bad: BoundConsumer = {
      name: "ok.name",
      queue: "mail/outbox",
      deliver: async () => ({ outcome: "success", ack: true }),
    };
    expect(() => h.queue.pushHandler(bad)).toThrow(InvalidConfigError);
    expect(() => h.queue.startWorker(bad)).toThrow(/cannot map "mail\/outbox"/);
    expect(() => h.queue.pushHandler({ ...bad, queue: "ok", name: "naïve" })).toThrow(InvalidConfigError);
    await expect(h.queue.publish("mail outbox", award())).rejects.toThrow(InvalidConfigError);
    expect(h.fake.sends).toHaveLength(0);
  });
});
