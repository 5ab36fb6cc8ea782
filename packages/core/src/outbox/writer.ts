/**
 * Writing jobs to the transactional outbox (`core.outbox`). A handler that
 * must tell the world outside the database (a partner, an e-mail service)
 * does not call it inside its work transaction — that would hold a pooled
 * connection and its locks for the provider's latency, and tell the provider
 * about work whose COMMIT may still fail. It publishes a job in the outbox
 * instead, in the same transaction: the job exists if and only if the work
 * committed. The relay (`@softcrum/core/outbox`) publishes it afterwards; its
 * own consumer makes the call, with its own retries and idempotency key.
 */
import { sql } from "drizzle-orm";
import { uuidv7 } from "uuidv7";
import { outbox } from "../db/schema.ts";
import type { AnyPgDatabase, WorkTransaction } from "../db/types.ts";
import { type Envelope, parseEnvelope } from "../envelope.ts";
import { InvalidConfigError } from "../errors.ts";

export interface OutboxPublishOptions {
  /**
   * Hold the job back this long, counted from the write (the relay publishes
   * it with what is left of the delay). At most 100 years. @default 0
   */
  readonly delayMs?: number;
  /** Deliver only to this consumer of the queue (`PublishOptions.targetConsumer`). @default every consumer */
  readonly targetConsumer?: string;
}

export interface OutboxReceipt {
  /** The outbox row's id (uuidv7): what the relay's logs and `core.outbox` name. */
  readonly outboxId: string;
  /** The envelope's job_id: the consumer's fence key, unchanged by however many times the row is relayed. */
  readonly jobId: string;
}

/** Publishes jobs in a transaction: they reach the queue only if that transaction commits. */
export interface Outbox {
  /**
   * Validates the envelope (an invalid one throws `InvalidEnvelopeError` here,
   * at the producer) and writes it to `core.outbox` in the transaction.
   */
  publish(queue: string, envelope: Envelope, opts?: OutboxPublishOptions): Promise<OutboxReceipt>;
}

/** Same rule as consumer and queue names elsewhere in the core. */
const QUEUE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/;
/**
 * The longest `delayMs`: refused here, not by the INSERT (a timestamp out of
 * Postgres's range), whose error would abort the caller's transaction.
 */
const MAX_DELAY_MS = 100 * 365.25 * 86_400_000;

/**
 * The outbox of a transaction you opened yourself (an HTTP handler that
 * writes its own rows, then wants a job run after they commit). Handlers get
 * the same thing as `ctx.outbox`, bound to the work transaction.
 */
export function outboxIn(tx: WorkTransaction | AnyPgDatabase): Outbox {
  return createOutboxWriter(tx);
}

/** `outboxIn`, plus a callback after each write (the harness uses it to wake the relay once the work commits). */
export function createOutboxWriter(tx: WorkTransaction | AnyPgDatabase, onWrite?: () => void): Outbox {
  return {
    async publish(queue, envelope, opts) {
      if (typeof queue !== "string" || !QUEUE_PATTERN.test(queue)) {
        throw new InvalidConfigError(
          `outbox: queue must be 1-200 letters, digits or . _ : -, got ${JSON.stringify(queue)}`,
        );
      }
      const valid = parseEnvelope(envelope);
      const delayMs = opts?.delayMs ?? 0;
      if (!(Number.isFinite(delayMs) && delayMs >= 0 && delayMs <= MAX_DELAY_MS)) {
        throw new InvalidConfigError(
          `outbox: delayMs must be a number of milliseconds from 0 to ${MAX_DELAY_MS} (100 years), got ${delayMs}`,
        );
      }
      const target = opts?.targetConsumer;
      if (target !== undefined && (typeof target !== "string" || !QUEUE_PATTERN.test(target))) {
        throw new InvalidConfigError(`outbox: targetConsumer must be a consumer name, got ${JSON.stringify(target)}`);
      }
      const id = uuidv7();
      await tx.insert(outbox).values({
        id,
        queue,
        payload: JSON.stringify(valid),
        jobId: valid.job_id,
        kind: valid.kind,
        targetConsumer: target ?? null,
        deliverAfter: delayMs > 0 ? sql`clock_timestamp() + make_interval(secs => ${delayMs / 1000})` : null,
      });
      onWrite?.();
      return { outboxId: id, jobId: valid.job_id };
    },
  };
}
