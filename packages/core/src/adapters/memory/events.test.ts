import { describe, expect, test } from "vitest";
import { ack, job, scripted } from "../../../test/scripted-consumer.ts";
import { createManualClock } from "../../clock.ts";
import { createMemoryQueue } from "./index.ts";

describe("memory queue", () => {
  test("an observer that throws neither breaks the delivery nor starves later observers", async () => {
    const queue = createMemoryQueue({ clock: createManualClock() });
    const seen: string[] = [];
    queue.onDelivery(() => {
      throw new Error("observer bug");
    });
    queue.onDelivery((e) => seen.push(e.result.outcome));
    queue.subscribe(scripted("q", () => ack).consumer);
    await queue.publish("q", job());
    await queue.drain();
    expect(seen).toEqual(["success"]);
    expect(queue.pending()).toBe(0);
    await queue.close();
  });
});
