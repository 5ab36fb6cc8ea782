/** Making dead letters the way production does: real deliveries of jobs whose handler refuses them. */

import type { MemoryQueue } from "../src/adapters/memory/index.ts";
import type { AnyPgDatabase } from "../src/consumer.ts";
import { deadLetters } from "../src/db/schema.ts";
import type { Envelope } from "../src/envelope.ts";

/**
 * Marks each envelope's customer as broken (its handler then refuses it),
 * publishes the envelopes one at a time, so the letters are created (and
 * ordered by id) as the envelopes are, and returns the letters' ids in order.
 */
export async function publishToDeadLetters(
  target: {
    readonly db: AnyPgDatabase;
    readonly queue: MemoryQueue;
    readonly queueName: string;
    readonly broken: Set<string>;
  },
  envelopes: readonly Envelope[],
): Promise<string[]> {
  for (const e of envelopes) target.broken.add((e.data as { customerId: string }).customerId);
  for (const e of envelopes) {
    await target.queue.publish(target.queueName, e);
    await target.queue.drain();
  }
  const rows = await target.db.select({ id: deadLetters.id, jobId: deadLetters.jobId }).from(deadLetters);
  return envelopes.map((e) => rows.find((r) => r.jobId === e.job_id)?.id as string);
}
