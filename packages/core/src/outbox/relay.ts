/**
 * The outbox relay: publishes committed `core.outbox` rows through a
 * `QueuePort` and marks them published.
 *
 * Each batch is one short transaction that locks up to `batchSize` due rows
 * with FOR UPDATE SKIP LOCKED, publishes them, and marks them in the same
 * transaction. So several relays (one per worker process) share the work
 * without waiting on each other or publishing the same row twice in normal
 * operation. The batch's publishes share one bound, `publishTimeoutMs`: a
 * transport that hangs keeps the transaction (its row locks, its connection,
 * its xid) open that long at most, and the rows it did not reach stay due for
 * the next batch, untouched. The same bound (plus a grace) is the batch's
 * server-side idle-in-transaction bound, whatever the session's: the batch
 * sends no SQL while it publishes, and a tighter bound of the role or the
 * database would kill it before its marks, every pass, so that the same rows
 * were published again forever; a frozen relay is still cut off.
 *
 * A row is marked published only when the transport says its message is
 * stored (`PublishReceipt.stored`: a Vercel 201). The relay is a republishing
 * path like the adapters' own, and reads every answer the same way: a 202
 * ("accepted for deferred processing": stored later, or never), a 429, a 5xx,
 * a timeout or a lost connection leaves the row unpublished, and it is
 * published again after a growing backoff (the row's `available_at`). The
 * row may be the job's only copy, so nothing unconfirmed is ever taken as
 * stored. Publishing again is safe: the copy carries the same job_id, so the
 * consuming harness's fence turns a second copy into a `duplicate` — as it
 * does when a relay dies after publishing and before its COMMIT.
 *
 * A refusal that no retry can change — the port's `InvalidEnvelopeError` (an
 * envelope too large for the transport) or `InvalidConfigError` — parks the
 * row instead: `available_at` becomes infinity, `last_error` says why, and
 * the relay logs an error. Published again every few minutes it would only
 * hide a job that never runs; parked, it waits for an operator
 * (`runbooks/outbox.md`).
 */
import { sql } from "drizzle-orm";
import { LAST_ERROR_MAX } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { serverTimeoutMs } from "../db/work-transaction.ts";
import type { Envelope } from "../envelope.ts";
import { describeError, InvalidConfigError, InvalidEnvelopeError, isSoftcrumError } from "../errors.ts";
import { rowsOf } from "../ops/operations.ts";
import { boundedText } from "../payload.ts";
import { consoleLogger, type Logger } from "../ports/logger.ts";
import { guardedLogger, ObserverFailures } from "../ports/observers.ts";
import { isStored, type PublishOptions, type QueuePort } from "../queue-port.ts";
import { deferralDelayMs } from "../retry.ts";
import { checkTimerPeriod, MAX_TIMER_DELAY_MS } from "../timers.ts";
import { nonNegative, positiveInteger } from "../validate.ts";

export interface OutboxRelayOptions {
  readonly db: AnyPgDatabase;
  /** Where the rows are published. */
  readonly queue: Pick<QueuePort, "publish">;
  /** Rows locked and published per transaction. @default 100 */
  readonly batchSize?: number;
  /**
   * Longest the publishes of one batch may take together: the one in
   * progress when it runs out counts as failed, the rows not reached stay
   * due (the batch's transaction, and its row locks, stay short). A publish
   * that still lands afterwards is published again later: a duplicate the
   * consumer's fence absorbs. At most 2^31 − 1 ms (a timer's limit). Behind
   * a pooler with a transaction idle timeout of its own (PgBouncer's
   * `idle_transaction_timeout`), keep it below that. @default 10_000
   */
  readonly publishTimeoutMs?: number;
  /** How often `start()` looks for rows nobody woke it for (another process's, a failed publish's retry). At most 2^31 − 1 ms. @default 1_000 */
  readonly pollIntervalMs?: number;
  /** Published rows are kept this long (for inspection), then pruned by the running relay. At most 100 years. @default 86_400_000 (24 h) */
  readonly keepPublishedMs?: number;
  /** @default console */
  readonly logger?: Logger;
  /** Source of jitter for the retry backoff, in [0, 1). @default Math.random */
  readonly random?: () => number;
}

export interface OutboxRelayReport {
  /** Rows published and marked. */
  readonly published: number;
  /** Rows whose publish failed; each comes back after a backoff. */
  readonly failed: number;
  /**
   * Rows the transport refused for good (`InvalidEnvelopeError`,
   * `InvalidConfigError`): parked, never published again by a relay until an
   * operator releases them (`runbooks/outbox.md`).
   */
  readonly parked: number;
  /**
   * Rows the transport accepted without saying it stored them (a Vercel
   * 202); each is published again after a backoff.
   */
  readonly unconfirmed: number;
  /** Transactions run. */
  readonly batches: number;
}

export interface OutboxRelay {
  /**
   * Publishes every due row, batch after batch, until a batch comes back
   * short (or `maxBatches`). Passes of one relay never overlap: a call waits
   * for the pass in progress, then runs its own, so it sees everything
   * committed before it was called. Throws when the database fails (rows
   * already published but not marked are published again by a later pass).
   */
  run(options?: { maxBatches?: number }): Promise<OutboxRelayReport>;
  /**
   * Asks for a pass soon, in the background (coalesced: a wake while a pass
   * is queued adds nothing). The harness calls it after a job that wrote to
   * the outbox commits (`HarnessDeps.outboxRelay`). Never throws.
   */
  wake(): void;
  /** Polls every `pollIntervalMs` (and prunes published rows now and then) until `stop()`; again after a `stop()`. */
  start(): void;
  /**
   * Stops polling and waking, and waits for the pass in progress and for any
   * pass asked for while it waits (a `run()`), so nothing publishes once it
   * returned — unless `start()` was called again meanwhile.
   */
  stop(): Promise<void>;
  /** Deletes published rows older than `keepPublishedMs`, in bounded batches; returns how many. */
  prune(): Promise<number>;
}

/** A publish ran past what was left of its batch's `publishTimeoutMs`. */
class BatchTimeoutError extends Error {
  constructor(publishTimeoutMs: number, leftMs: number) {
    super(
      `publish did not settle within the batch's publishTimeoutMs (${publishTimeoutMs} ms, ${Math.round(leftMs)} ms left for it)`,
    );
    this.name = "BatchTimeoutError";
  }
}

/** Why a row the transport accepted without confirming it is published again. */
const UNCONFIRMED =
  "the transport accepted the message without confirming it is stored (a Vercel 202: stored later, or never); not confirmed, so it is published again after a backoff (a copy that was stored is a duplicate the consumer's fence absorbs)";

/** Why a parked row waits (its `last_error` starts with it). */
const PARKED =
  "parked, not published again until released by hand (runbooks/outbox.md): the transport refuses it, and no retry changes that";

/** Backoff of a row whose publish failed: from about a second, doubling, up to 5 minutes. */
const FAILED_PUBLISH_BACKOFF = { baseMs: 1_000, capMs: 300_000 } as const;
const PRUNE_EVERY_MS = 3_600_000;
const PRUNE_BATCH = 5_000;
/** The longest `keepPublishedMs`: `now() - keepPublishedMs` must stay a timestamp Postgres can hold. */
const MAX_KEEP_PUBLISHED_MS = 100 * 365.25 * 86_400_000;

interface DueRow {
  id: string;
  queue: string;
  payload: string;
  target_consumer: string | null;
  delay_ms: number | string | null;
  attempts: number;
}

export function createOutboxRelay(options: OutboxRelayOptions): OutboxRelay {
  return new Relay(options);
}

class Relay implements OutboxRelay {
  readonly #db: AnyPgDatabase;
  readonly #queue: Pick<QueuePort, "publish">;
  readonly #batchSize: number;
  readonly #publishTimeoutMs: number;
  readonly #pollIntervalMs: number;
  readonly #keepPublishedMs: number;
  /** The batch transaction's `idle_in_transaction_session_timeout`, e.g. "11000ms". */
  readonly #idleBound: string;
  readonly #logger: Logger;
  readonly #random: () => number;
  /** The tail of the chain of passes: each starts when the previous one settled. */
  #tail: Promise<unknown> = Promise.resolve();
  #wakeQueued = false;
  #stopped = false;
  #timer: NodeJS.Timeout | undefined;
  #lastPrune = 0;

  constructor(options: OutboxRelayOptions) {
    this.#db = options.db;
    this.#queue = options.queue;
    this.#batchSize = positiveInteger(options.batchSize ?? 100, "outbox relay batchSize");
    this.#publishTimeoutMs = timerMs(options.publishTimeoutMs ?? 10_000, "outbox relay publishTimeoutMs");
    this.#pollIntervalMs = timerMs(options.pollIntervalMs ?? 1_000, "outbox relay pollIntervalMs");
    this.#keepPublishedMs = nonNegative(options.keepPublishedMs ?? 86_400_000, "outbox relay keepPublishedMs");
    if (this.#keepPublishedMs > MAX_KEEP_PUBLISHED_MS) {
      throw new InvalidConfigError(
        `outbox relay keepPublishedMs must be at most ${MAX_KEEP_PUBLISHED_MS} ms (100 years: prune() compares published_at with now() minus it, which Postgres must be able to hold), got ${this.#keepPublishedMs}`,
      );
    }
    // The publishes' bound plus the engine's grace: the relay gives up first,
    // on a live session; the server's bound is for a relay frozen or cut off.
    // An integer setting: capped at its maximum, which is the timer's.
    this.#idleBound = `${Math.min(serverTimeoutMs(this.#publishTimeoutMs), MAX_TIMER_DELAY_MS)}ms`;
    // Observers never change an outcome: a logger that throws inside a batch
    // would roll back the marks of rows already published.
    this.#logger = guardedLogger(options.logger ?? consoleLogger, new ObserverFailures());
    this.#random = options.random ?? Math.random;
  }

  run(options: { maxBatches?: number } = {}): Promise<OutboxRelayReport> {
    return this.#enqueue(() => this.#pass(options.maxBatches));
  }

  wake(): void {
    if (this.#stopped || this.#wakeQueued) return;
    this.#wakeQueued = true;
    this.#enqueue(() => {
      this.#wakeQueued = false;
      return this.#stopped ? Promise.resolve(undefined) : this.#pass(undefined);
    }).catch((thrown: unknown) => {
      this.#logger.warn(`outbox relay pass failed (the next pass retries): ${describeError(thrown)}`);
    });
  }

  start(): void {
    if (this.#timer) return;
    this.#stopped = false;
    this.#timer = setInterval(() => {
      this.wake();
      if (Date.now() - this.#lastPrune >= PRUNE_EVERY_MS) {
        this.#lastPrune = Date.now();
        this.#enqueue(() => this.prune()).catch((thrown: unknown) => {
          this.#logger.warn(`outbox prune failed (the next one retries): ${describeError(thrown)}`);
        });
      }
    }, this.#pollIntervalMs);
    this.#timer.unref();
    this.wake();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    // A pass enqueued while this waited extends the chain: wait for it too.
    for (;;) {
      const tail = this.#tail;
      await tail;
      if (tail === this.#tail || !this.#stopped) return;
    }
  }

  async prune(): Promise<number> {
    let pruned = 0;
    for (;;) {
      const result = await this.#db.execute(sql`
        with victim as (
          select id from core.outbox
          where published_at is not null
            and published_at < now() - make_interval(secs => ${this.#keepPublishedMs / 1000})
          order by published_at
          limit ${PRUNE_BATCH}
          for update skip locked
        )
        delete from core.outbox o using victim where o.id = victim.id
        returning 1`);
      const n = rowsOf(result).length;
      pruned += n;
      if (n < PRUNE_BATCH || this.#stopped) return pruned;
    }
  }

  #enqueue<T>(pass: () => Promise<T>): Promise<T> {
    const next = this.#tail.then(pass);
    this.#tail = next.catch(() => {});
    return next;
  }

  async #pass(maxBatches: number | undefined): Promise<OutboxRelayReport> {
    let published = 0;
    let failed = 0;
    let parked = 0;
    let unconfirmed = 0;
    let batches = 0;
    for (;;) {
      if (maxBatches !== undefined && batches >= maxBatches) break;
      const batch = await this.#batch();
      batches += 1;
      published += batch.published;
      failed += batch.failed;
      parked += batch.parked;
      unconfirmed += batch.unconfirmed;
      if (batch.locked < this.#batchSize || this.#stopped) break;
    }
    return { published, failed, parked, unconfirmed, batches };
  }

  /**
   * One transaction: lock due rows, publish them one after another within
   * one bound for all, mark what is stored, push back what is not, park
   * what the transport refuses for good.
   */
  #batch(): Promise<{ locked: number; published: number; failed: number; parked: number; unconfirmed: number }> {
    return this.#db.transaction(async (tx) => {
      // No SQL goes out while the batch publishes: the session's idle bound
      // (the role's, the database's) must not end the transaction before its
      // marks. The relay's own, set for this transaction only (see the top).
      await tx.execute(sql`select set_config('idle_in_transaction_session_timeout', ${this.#idleBound}, true)`);
      const rows = rowsOf<DueRow>(
        await tx.execute(sql`
          select id, queue, payload, target_consumer, attempts,
                 greatest(0, ceil(extract(epoch from (deliver_after - clock_timestamp())) * 1000))::float8 as delay_ms
          from core.outbox
          where published_at is null and available_at <= now()
          order by available_at, id
          limit ${this.#batchSize}
          for update skip locked`),
      );
      const marked: { id: string; message_id: string | null }[] = [];
      const later: { row: DueRow; error: string; unconfirmed: boolean }[] = [];
      const parked: { row: DueRow; error: string }[] = [];
      const until = performance.now() + this.#publishTimeoutMs;
      for (const row of rows) {
        const leftMs = until - performance.now();
        if (leftMs <= 0) break; // the batch's bound is spent: the rest stay due, untouched
        try {
          const receipt = await this.#publish(row, leftMs);
          if (isStored(receipt)) marked.push({ id: row.id, message_id: receipt.messageId });
          else later.push({ row, error: UNCONFIRMED, unconfirmed: true });
        } catch (thrown) {
          if (refusedForGood(thrown)) parked.push({ row, error: lastError(`${PARKED}: ${describeError(thrown)}`) });
          else later.push({ row, error: lastError(describeError(thrown)), unconfirmed: false });
          if (thrown instanceof BatchTimeoutError) break; // it took what was left of the bound
        }
      }
      for (const { row, error } of later) {
        const delayMs = deferralDelayMs(row.attempts, FAILED_PUBLISH_BACKOFF, this.#random);
        this.#logger.warn(`outbox relay: publishing row ${row.id} to "${row.queue}": ${error}`, {
          outboxId: row.id,
          queue: row.queue,
          attempts: row.attempts + 1,
          retryInMs: delayMs,
        });
        await tx.execute(sql`
          update core.outbox
          set attempts = attempts + 1, last_error = ${error},
              available_at = clock_timestamp() + make_interval(secs => ${delayMs / 1000})
          where id = ${row.id}`);
      }
      for (const { row, error } of parked) {
        this.#logger.error(`outbox relay: row ${row.id} to "${row.queue}" parked: ${error}`, {
          outboxId: row.id,
          queue: row.queue,
          attempts: row.attempts + 1,
        });
        await tx.execute(sql`
          update core.outbox
          set attempts = attempts + 1, last_error = ${error}, available_at = 'infinity'
          where id = ${row.id}`);
      }
      if (marked.length > 0) {
        await tx.execute(sql`
          update core.outbox o
          set published_at = now(), attempts = o.attempts + 1, last_error = null, message_id = u.message_id
          from jsonb_to_recordset(${JSON.stringify(marked)}::jsonb) as u(id uuid, message_id text)
          where o.id = u.id`);
      }
      const unconfirmed = later.filter((l) => l.unconfirmed).length;
      return {
        locked: rows.length,
        published: marked.length,
        failed: later.length - unconfirmed,
        parked: parked.length,
        unconfirmed,
      };
    });
  }

  /** Publishes one row within `ms`, else rejects (the publish may still land: a copy the fence absorbs). */
  async #publish(row: DueRow, ms: number) {
    const delayMs = Number(row.delay_ms ?? 0);
    const opts: PublishOptions = {
      ...(delayMs > 0 ? { delayMs } : {}),
      ...(row.target_consumer !== null ? { targetConsumer: row.target_consumer } : {}),
    };
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new BatchTimeoutError(this.#publishTimeoutMs, ms)), ms);
    });
    try {
      // The payload was validated when it was written; the port validates it again.
      return await Promise.race([this.#queue.publish(row.queue, envelopeOf(row.payload), opts), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * A row's envelope. A payload that is not JSON (a row inserted by hand: the
 * writer stores only validated envelopes) is refused for good, like an
 * invalid envelope, so it is parked rather than tried again forever.
 */
function envelopeOf(payload: string): Envelope {
  try {
    return JSON.parse(payload) as Envelope;
  } catch (thrown) {
    throw new InvalidEnvelopeError([`the outbox row's payload is not JSON (${describeError(thrown)})`]);
  }
}

/** A publish refusal no retry can change: the envelope or the port's settings (e.g. an envelope too large for the transport). */
function refusedForGood(thrown: unknown): boolean {
  return isSoftcrumError(thrown, "INVALID_ENVELOPE") || isSoftcrumError(thrown, "INVALID_CONFIG");
}

/** What `last_error` can hold: Postgres text refuses NUL (the UPDATE would fail, and with it the batch's marks). */
function lastError(text: string): string {
  return boundedText(text, LAST_ERROR_MAX) ?? "";
}

/** A whole number of ms a timer honours (longer ones become 1 ms), else an InvalidConfigError naming the option. */
function timerMs(value: number, name: string): number {
  positiveInteger(value, name);
  try {
    return checkTimerPeriod(name, value);
  } catch (thrown) {
    throw new InvalidConfigError(thrown instanceof Error ? thrown.message : String(thrown));
  }
}
