/**
 * Coalescing windows for dead-letter alerts (SPEC §4 "Alerts"): identical
 * failures — same queue, consumer, error class and error fingerprint — make
 * one alert per window, with a count, across the whole fleet of workers.
 *
 * The protocol, the same for both stores:
 * - `record()` counts one occurrence. The occurrence that opens a window (the
 *   key's first, or the first after the window ended) is told to send the
 *   alert, with what the previous window left unreported; every other one is
 *   told to stay quiet and is counted as `unreported`.
 * - `takeUnreported()` hands a window's unreported count to exactly one caller
 *   and resets it: the summary sent at the window's end (or on close).
 * - `takeEnded()` (shared store) does the same for every window that ended
 *   with a count no summary took: the process that counted it may have ended
 *   (a serverless function, a killed worker); any process's flush reports it.
 * Counts are never lost: whatever no summary took is carried by the next
 * window's first alert.
 *
 * `postgresAlertWindows` keeps the windows in `core.alert_windows`, so every
 * process sharing the database shares them; each step is one atomic
 * statement, so two processes racing get exactly one "send".
 * `memoryAlertWindows` keeps them in the process.
 */
import { createHash } from "node:crypto";
import { sql } from "drizzle-orm";
import type { DeadLetterErrorClass } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";

/** What coalesces: the same failure mode of the same consumer. */
export interface AlertWindowKey {
  readonly queue: string;
  readonly consumer: string;
  readonly errorClass: DeadLetterErrorClass;
  readonly fingerprint: string;
}

export type WindowDecision =
  | {
      readonly send: true;
      readonly windowNumber: number;
      /** Occurrences of the previous window that no summary reported, when there were any. */
      readonly previous?: { readonly count: number; readonly windowStartedAt: number };
    }
  | { readonly send: false; readonly windowNumber: number; readonly windowStartedAt: number };

export interface UnreportedOccurrences {
  readonly count: number;
  readonly firstDeadLetterId: string;
  readonly windowStartedAt: number;
}

/** Unreported occurrences of a window that has ended, with what names its failure mode. */
export interface EndedWindow extends UnreportedOccurrences {
  readonly key: AlertWindowKey;
  readonly windowNumber: number;
}

export interface AlertWindowStore {
  /** Counts one occurrence at `at` (ms since the epoch) in a window of `windowMs`. */
  record(key: AlertWindowKey, deadLetterId: string, at: number, windowMs: number): Promise<WindowDecision>;
  /** The window's unreported occurrences, taken (reset to 0) by exactly one caller; undefined when none. */
  takeUnreported(key: AlertWindowKey, windowNumber: number): Promise<UnreportedOccurrences | undefined>;
  /**
   * The unreported occurrences of windows that ended by `at`, whoever counted
   * them (a process that ended before its summary was due), taken like
   * `takeUnreported`; at most `limit` windows. Only a shared store has them.
   */
  takeEnded?(windowMs: number, at: number, limit: number): Promise<EndedWindow[]>;
}

/** The primary key of a window row: bounded, whatever the names' lengths. */
export function alertWindowKey(key: AlertWindowKey): string {
  return createHash("sha256")
    .update([key.queue, key.consumer, key.errorClass, key.fingerprint].join("\u0000"))
    .digest("hex");
}

/** Windows in this process only: each process sends its own first alert per window. */
export function memoryAlertWindows(): AlertWindowStore {
  const windows = new Map<
    string,
    { number: number; startedAt: number; first: string; unreported: number; windowMs: number }
  >();
  return {
    async record(key, deadLetterId, at, windowMs) {
      const id = alertWindowKey(key);
      const open = windows.get(id);
      if (open && open.startedAt + windowMs > at) {
        open.unreported += 1;
        return { send: false, windowNumber: open.number, windowStartedAt: open.startedAt };
      }
      // Ended windows with nothing left to report are forgotten, so the map holds only live failure modes.
      for (const [other, w] of windows) {
        if (w.unreported === 0 && w.startedAt + w.windowMs <= at) windows.delete(other);
      }
      const number = (open?.number ?? 0) + 1;
      windows.set(id, { number, startedAt: at, first: deadLetterId, unreported: 0, windowMs });
      return open && open.unreported > 0
        ? { send: true, windowNumber: number, previous: { count: open.unreported, windowStartedAt: open.startedAt } }
        : { send: true, windowNumber: number };
    },
    async takeUnreported(key, windowNumber) {
      const open = windows.get(alertWindowKey(key));
      if (!open || open.number !== windowNumber || open.unreported === 0) return undefined;
      const count = open.unreported;
      open.unreported = 0;
      return { count, firstDeadLetterId: open.first, windowStartedAt: open.startedAt };
    },
  };
}

/** postgres.js returns rows as an array, PGlite and node-postgres as `{ rows }`. */
function rowsOf<T>(result: unknown): T[] {
  return (Array.isArray(result) ? result : ((result as { rows?: T[] }).rows ?? [])) as T[];
}

const epochMs = (column: string) => sql.raw(`(extract(epoch from ${column}) * 1000)::float8`);

/** Windows in `core.alert_windows`, shared by every process on the database. */
export function postgresAlertWindows(db: AnyPgDatabase): AlertWindowStore {
  return {
    async record(key, deadLetterId, at, windowMs) {
      const now = new Date(at).toISOString();
      // One statement: the row lock of ON CONFLICT DO UPDATE orders racing
      // processes, and each sees the row as the one before it left it. Every
      // SET expression reads the old row, so `ended` is the same in all of them.
      const ended = sql`w.window_started_at + ${windowMs}::float8 * interval '1 millisecond' <= excluded.window_started_at`;
      const result = await db.execute(sql`
        insert into core.alert_windows as w
          (key, queue, consumer, error_class, error_fingerprint, window_number, window_started_at,
           first_dead_letter_id, unreported, previous_unreported, last_seen_at)
        values (${alertWindowKey(key)}, ${key.queue}, ${key.consumer}, ${key.errorClass}, ${key.fingerprint}, 1,
                ${now}::timestamptz, ${deadLetterId}, 0, 0, ${now}::timestamptz)
        on conflict (key) do update set
          window_number = case when ${ended} then w.window_number + 1 else w.window_number end,
          window_started_at = case when ${ended} then excluded.window_started_at else w.window_started_at end,
          first_dead_letter_id = case when ${ended} then excluded.first_dead_letter_id else w.first_dead_letter_id end,
          unreported = case when ${ended} then 0 else w.unreported + 1 end,
          previous_unreported = case when ${ended} then w.unreported else w.previous_unreported end,
          previous_window_started_at = case when ${ended} then w.window_started_at else w.previous_window_started_at end,
          last_seen_at = greatest(w.last_seen_at, excluded.last_seen_at)
        returning window_number, unreported, previous_unreported,
                  ${epochMs("window_started_at")} as started_ms,
                  ${epochMs("previous_window_started_at")} as previous_started_ms`);
      const [row] = rowsOf<{
        window_number: number;
        unreported: number;
        previous_unreported: number;
        started_ms: number;
        previous_started_ms: number | null;
      }>(result);
      if (!row) throw new Error("alert window upsert returned no row");
      // Only the occurrence that opened the window leaves `unreported` at 0:
      // the others add one to it, and a summary that reset it to 0 is followed by +1.
      if (row.unreported !== 0) {
        return { send: false, windowNumber: row.window_number, windowStartedAt: Number(row.started_ms) };
      }
      return row.previous_unreported > 0 && row.previous_started_ms !== null
        ? {
            send: true,
            windowNumber: row.window_number,
            previous: { count: row.previous_unreported, windowStartedAt: Number(row.previous_started_ms) },
          }
        : { send: true, windowNumber: row.window_number };
    },
    async takeUnreported(key, windowNumber) {
      // FOR UPDATE re-reads the row after a racing summary committed: it then
      // finds unreported = 0 and takes nothing, so one summary reports a count.
      const result = await db.execute(sql`
        with taken as (
          select key, unreported from core.alert_windows
          where key = ${alertWindowKey(key)} and window_number = ${windowNumber} and unreported > 0
          for update
        )
        update core.alert_windows w set unreported = 0
        from taken where w.key = taken.key
        returning taken.unreported as count, w.first_dead_letter_id, ${epochMs("w.window_started_at")} as started_ms`);
      const [row] = rowsOf<{ count: number; first_dead_letter_id: string; started_ms: number }>(result);
      return row
        ? { count: row.count, firstDeadLetterId: row.first_dead_letter_id, windowStartedAt: Number(row.started_ms) }
        : undefined;
    },
    async takeEnded(windowMs, at, limit) {
      // As takeUnreported, for every ended window at once; SKIP LOCKED leaves
      // a window another process is taking (or counting in) right now to it.
      const result = await db.execute(sql`
        with taken as (
          select key, unreported from core.alert_windows
          where unreported > 0
            and window_started_at + ${windowMs}::float8 * interval '1 millisecond' <= ${new Date(at).toISOString()}::timestamptz
          order by window_started_at
          limit ${limit}
          for update skip locked
        )
        update core.alert_windows w set unreported = 0
        from taken where w.key = taken.key
        returning taken.unreported as count, w.queue, w.consumer, w.error_class, w.error_fingerprint,
                  w.window_number, w.first_dead_letter_id, ${epochMs("w.window_started_at")} as started_ms`);
      return rowsOf<{
        count: number;
        queue: string;
        consumer: string;
        error_class: DeadLetterErrorClass;
        error_fingerprint: string;
        window_number: number;
        first_dead_letter_id: string;
        started_ms: number;
      }>(result).map((row) => ({
        key: {
          queue: row.queue,
          consumer: row.consumer,
          errorClass: row.error_class,
          fingerprint: row.error_fingerprint,
        },
        windowNumber: row.window_number,
        count: row.count,
        firstDeadLetterId: row.first_dead_letter_id,
        windowStartedAt: Number(row.started_ms),
      }));
    },
  };
}
