/**
 * The transport-hold store over `core.transport_holds` (#19): the deliveries
 * a transport kept on their lease without running the handler or spending
 * an attempt, so that a provider counting leases (Vercel Queues) does not
 * make a kept message look like a spent attempt when it comes back.
 * Every call is bounded by the consumer's `timeoutMs`, its connection
 * included: a transport waits on it inside a delivery.
 */
import { sql } from "drizzle-orm";
import type { TransportHolds } from "../queue-port.ts";
import { withinMs } from "../timers.ts";
import type { AnyPgDatabase } from "./types.ts";

/** postgres.js returns rows as an array, PGlite and node-postgres as `{ rows }`. */
function rowsOf<T>(result: unknown): T[] {
  if (Array.isArray(result)) return result as T[];
  const rows = (result as { rows?: unknown })?.rows;
  return Array.isArray(rows) ? (rows as T[]) : [];
}

export class TransportHoldTimeoutError extends Error {
  override readonly name = "TransportHoldTimeoutError";
}

/** The holds of `consumer`'s messages in `db`, each call given up on after `timeoutMs`. */
export function postgresTransportHolds(db: AnyPgDatabase, consumer: string, timeoutMs: number): TransportHolds {
  const bounded = <T>(what: string, work: Promise<T>) =>
    withinMs(
      work,
      timeoutMs,
      () => new TransportHoldTimeoutError(`${what} of a transport hold did not end within ${timeoutMs} ms`),
    );
  return {
    async record(messageKey, deliveryCount) {
      await bounded(
        "the record",
        db.execute(sql`
          insert into core.transport_holds (consumer, message_key, delivery_count)
          values (${consumer}, ${messageKey}, ${deliveryCount})
          on conflict do nothing`),
      );
    },
    async before(messageKey, deliveryCount) {
      const result = await bounded(
        "the read",
        db.execute(sql`
          select count(*)::int as holds, coalesce(bool_or(successor_seen_at is not null), false) as succeeded
          from core.transport_holds
          where consumer = ${consumer} and message_key = ${messageKey} and delivery_count < ${deliveryCount}`),
      );
      const [row] = rowsOf<{ holds: number | string; succeeded: boolean }>(result);
      return { holds: Number(row?.holds ?? 0), succeeded: row?.succeeded === true };
    },
    async succeeded(messageKey, deliveryCount) {
      await bounded(
        "the successor's mark",
        db.execute(sql`
          update core.transport_holds set successor_seen_at = now()
          where consumer = ${consumer} and message_key = ${messageKey} and delivery_count = ${deliveryCount}
            and successor_seen_at is null`),
      );
    },
  };
}
