/** What the batch tests share: numbered jobs, delivering them at once, and reading a delivery's charge. */
import { createEnvelope, type Envelope } from "../src/envelope.ts";
import type { BoundConsumer, DeliveryResult } from "../src/queue-port.ts";

export const job = (n: number) => createEnvelope({ tenantId: "t", kind: "test.v1", data: { n } });
export const jobs = (count: number, from = 1) => Array.from({ length: count }, (_, i) => job(from + i));
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Delivers every envelope at once (they gather into batches), in order. */
export function together(
  bound: BoundConsumer,
  envelopes: readonly Envelope[],
  deliveryCount = 1,
): Promise<DeliveryResult[]> {
  return Promise.all(envelopes.map((e) => bound.deliver({ body: JSON.stringify(e), deliveryCount })));
}

/** A delivery's outcome and whether it spends an attempt (undefined where the outcome has no such field). */
export const outcomeAndAttempt = (r: DeliveryResult) => [r.outcome, "spendsAttempt" in r ? r.spendsAttempt : undefined];
