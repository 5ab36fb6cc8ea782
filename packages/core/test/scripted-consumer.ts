/**
 * Scripted consumers for the in-process queue's tests: a consumer that
 * answers each delivery from a script, to drive the transport on its own.
 */
import { createEnvelope } from "../src/envelope.ts";
import type { BoundConsumer, Delivery, DeliveryResult } from "../src/queue-port.ts";

/** A consumer that answers each delivery from a script, to drive the transport on its own. */
export function scripted(
  queue: string,
  answer: (d: Delivery, n: number) => DeliveryResult | Promise<DeliveryResult>,
  name = "c",
) {
  const seen: Delivery[] = [];
  const consumer: BoundConsumer = {
    name,
    queue,
    async deliver(delivery) {
      seen.push(delivery);
      return answer(delivery, seen.length);
    },
  };
  return { consumer, seen };
}

export const ack: DeliveryResult = { outcome: "success", ack: true };
export const job = () => createEnvelope({ tenantId: "t", kind: "k.v1", data: { n: 1 } });
