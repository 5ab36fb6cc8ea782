/**
 * What a handler is given for one run (`HandlerContext`), and the harness's
 * implementation of it: the run's transaction, its envelope and attempt, the
 * run's AbortSignal, an idempotency key for outbound calls, and the outbox.
 */
import { createHash } from "node:crypto";
import type { WorkTransaction } from "./db/types.ts";
import type { Envelope } from "./envelope.ts";
import { createOutboxWriter, type Outbox } from "./outbox/writer.ts";

export interface HandlerContext {
  /** Do every database write of the job through this: it commits or rolls back together with the fence. */
  readonly tx: WorkTransaction;
  readonly envelope: Envelope;
  /** 1 on the first run of the handler for this job. */
  readonly attempt: number;
  /**
   * A stable key for this (job, consumer), to pass to providers that accept an
   * idempotency key (payments, e-mail): their side effects are outside the
   * transaction, so only the provider can de-duplicate them.
   */
  readonly idempotencyKey: string;
  /**
   * Fires when the run passes the consumer's `timeoutMs`: pass it to outbound
   * calls (`fetch(url, { signal })`). By then the transaction is rolled back
   * and its connection destroyed; nothing written through `tx` afterwards runs.
   */
  readonly signal: AbortSignal;
  /**
   * Publishes jobs in this transaction (`core.outbox`): they reach their
   * queue only once the work commits. Use it instead of calling a provider
   * here; the provider call belongs in the consumer of that job.
   */
  readonly outbox: Outbox;
}

/** The context of one run; made per job, its key and outbox on first use. */
export class Context implements HandlerContext {
  #idempotencyKey: string | undefined;
  #outbox: Outbox | undefined;
  /** Set by the first outbox write: the harness wakes the relay after the commit. */
  wroteOutbox = false;
  constructor(
    readonly tx: WorkTransaction,
    readonly envelope: Envelope,
    readonly attempt: number,
    private readonly consumerName: string,
    private readonly run: { readonly signal: AbortSignal },
  ) {}

  get signal(): AbortSignal {
    return this.run.signal;
  }

  // Computed on first use: most handlers never call an external provider.
  get idempotencyKey(): string {
    this.#idempotencyKey ??= createHash("sha256")
      .update(`${this.envelope.job_id}\u0000${this.consumerName}`)
      .digest("hex");
    return this.#idempotencyKey;
  }

  // Created on first use, like the key: most handlers write nothing to the outbox.
  get outbox(): Outbox {
    this.#outbox ??= createOutboxWriter(this.tx, () => {
      this.wroteOutbox = true;
    });
    return this.#outbox;
  }
}
