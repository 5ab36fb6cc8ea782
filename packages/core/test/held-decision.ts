/** A dead-letter decision caught in flight, for the tests of a fence insert that waits on one. */
import { sql } from "drizzle-orm";
import type { AnyPgDatabase } from "../src/db/types.ts";
import { decideDeadLetter } from "../src/db/work-transaction.ts";
import type { Envelope } from "../src/envelope.ts";
import { latch } from "./latch.ts";

/**
 * A dead-letter decision of `envelope`'s job for `consumer` that has written
 * its letter (`exhausted`) and holds the fence key, uncommitted, until
 * `release()`; `decision` settles once it has committed.
 */
export async function heldLetterDecision(
  db: AnyPgDatabase,
  envelope: Envelope,
  consumer: { readonly name: string; readonly queue: string },
) {
  const held = latch();
  const holding = latch();
  const decision = decideDeadLetter(db, { jobId: envelope.job_id, consumer: consumer.name }, async (tx) => {
    await tx.execute(sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
      values (gen_random_uuid(), ${envelope.job_id}, ${consumer.queue}, ${consumer.name}, ${JSON.stringify(envelope)}, 5, 'the earlier attempts failed', 'exhausted')`);
    holding.open();
    await held.opened;
  });
  await holding.opened;
  return { decision, release: held.open };
}
