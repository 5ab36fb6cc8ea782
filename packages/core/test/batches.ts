/** What the batch tests share: numbered jobs, delivering them at once, and reading a delivery's charge. */
import { createEnvelope, type Envelope } from "../src/envelope.ts";
import type { BoundConsumer, DeliveryResult } from "../src/queue-port.ts";
import type { DriverCase } from "./drivers.ts";

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

/**
 * A deferred check on test_effects, named `name`, that runs `plpgsql` (a
 * statement list over `new`) at COMMIT — or wherever the engine fires the
 * pending deferred triggers. Returns what drops it again.
 */
export async function deferredCheckOnEffects(
  c: DriverCase,
  name: string,
  plpgsql: string,
): Promise<() => Promise<void>> {
  await c.rows(`create or replace function ${name}() returns trigger language plpgsql as $$
    begin ${plpgsql} return null; end $$`);
  await c.rows(`drop trigger if exists ${name} on test_effects`);
  await c.rows(`create constraint trigger ${name} after insert on test_effects
    deferrable initially deferred for each row execute function ${name}()`);
  return async () => {
    await c.rows(`drop trigger if exists ${name} on test_effects`);
  };
}
