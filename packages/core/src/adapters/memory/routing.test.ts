import { describe, expect, test } from "vitest";
import { ack, job, scripted } from "../../../test/scripted-consumer.ts";
import { createManualClock } from "../../clock.ts";
import { createMemoryQueue } from "./index.ts";

describe("memory queue", () => {
  test("each consumer of a queue gets its own copy; messages published before subscribing wait for the first one", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    await queue.publish("q", job());
    const a = scripted("q", () => ack, "a");
    const b = scripted("q", () => ack, "b");
    queue.subscribe(a.consumer);
    queue.subscribe(b.consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(a.seen).toHaveLength(2);
    expect(b.seen).toHaveLength(1);
    expect(() => queue.subscribe(a.consumer)).toThrow(/already subscribed/);
    await queue.close();
  });
});
