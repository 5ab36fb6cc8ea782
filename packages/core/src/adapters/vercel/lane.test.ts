import { describe, expect, test } from "vitest";
import { TEST_QUEUE_SECRET } from "../../../test/fake-vercel-queues.ts";
import { useEffectsDatabase } from "../../../test/fixtures.ts";
import { pointsFixture } from "../../../test/points-fixture.ts";
import { InvalidConfigError } from "../../errors.ts";
import { createVercelQueue } from "./queue.ts";

const pg = useEffectsDatabase("vercel-lane");

const { pointsConsumer, bind } = pointsFixture(pg, "vercel");

describe("configuration", () => {
  test("a consumer whose handler time bound is not below the lease is refused where it is bound (#8 item 12)", async () => {
    const queue = createVercelQueue({
      env: {},
      region: "iad1",
      token: "t",
      deploymentId: null,
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    const consumer = bind(pointsConsumer());
    const slow = { name: consumer.name, queue: consumer.queue, timeoutMs: 300_000, deliver: consumer.deliver };
    expect(() => queue.pushHandler(slow)).toThrow(InvalidConfigError);
    expect(() => queue.startWorker(slow)).toThrow(/must be below the lease \(visibilityTimeoutSeconds 300 s\)/);
    await expect(queue.receiveAvailable(slow)).rejects.toThrow(InvalidConfigError);
    expect(() => queue.pushHandler({ ...slow, timeoutMs: 299_999 })).not.toThrow();
    await queue.close();
  });

  test("a bound consumer whose whole delivery (2 × timeoutMs + 5 s) is not below the lease is refused, though its timeoutMs is (#18 item 7)", async () => {
    const queue = createVercelQueue({
      env: {},
      region: "iad1",
      token: "t",
      deploymentId: null,
      visibilityTimeoutSeconds: 60,
      wrapperSecret: TEST_QUEUE_SECRET,
    });
    const tooLong = bind({ ...pointsConsumer(), timeoutMs: 30_000 });
    expect(tooLong.deliveryBoundMs).toBe(65_000);
    expect(() => queue.pushHandler(tooLong)).toThrow(
      /deliveryBoundMs 65000: .*must be below the lease \(visibilityTimeoutSeconds 60 s\)/,
    );
    const fits = bind({ ...pointsConsumer(), timeoutMs: 27_000 });
    expect(() => queue.pushHandler(fits)).not.toThrow();
    await queue.close();
  });
});
