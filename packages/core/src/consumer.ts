import type { z } from "zod";
import { alertErrorFields } from "./alerts/redact.ts";
import { AlertSender } from "./alerts/sender.ts";
import { Context } from "./context.ts";
import { batchedWorkTransactionFor } from "./db/batch.ts";
import { upsertDeadLetter } from "./db/dead-letter-write.ts";
import { isInstance } from "./db/errors.ts";
import { LAST_ERROR_MAX } from "./db/schema.ts";
import { postgresTransportHolds } from "./db/transport-holds.ts";
import type { AnyPgDatabase, WorkTransaction } from "./db/types.ts";
import {
  decideDeadLetter,
  ROLLBACK_WAIT_MS,
  type RunInWorkTransaction,
  WorkNotStartedError,
  workTransactionFor,
} from "./db/work-transaction.ts";
import {
  classifySafely,
  type DeadLetterInput,
  type DeadLetterWrite,
  dueAtOf,
  MAX_ATTEMPTS_STORED,
  OutsideBudget,
  type UnwrittenLetter,
  withCountableDeferrals,
} from "./delivery-parts.ts";
import { ENVELOPE_FIELD_MAX, type Envelope, isJobId } from "./envelope.ts";
import { describeError, InvalidConfigError } from "./errors.ts";
import { deliveryBoundMs, FENCE_TTL_CLOCK_ALLOWANCE_MS, fenceTtlMarginMs, type HarnessDeps } from "./harness-deps.ts";
import { type LaneAdmission, LaneGate } from "./lanes/gate.ts";
import { type Admission, RateGate } from "./limits/gate.ts";
import { LruMap } from "./lru-map.ts";
import { boundedText, payloadSha256, type ReceivedPayload } from "./payload.ts";
import { checkPayload } from "./poison-check.ts";
import { noopAlerts } from "./ports/alerts.ts";
import { consoleLogger, type Logger } from "./ports/logger.ts";
import { type JobMetricAttributes, type MetricsPort, noopMetrics } from "./ports/metrics.ts";
import { guardedLogger, guardedMetrics, ObserverFailures } from "./ports/observers.ts";
import type { BoundConsumer, Delivery, DeliveryOutcome, DeliveryResult, TransportHolds } from "./queue-port.ts";
import { DEFAULT_DEFERRAL_HORIZON_MS, deferralDelayMs, RATE_LIMIT_BACKOFF, retryDelayMs } from "./retry.ts";
import { withinMs } from "./timers.ts";

export type { HandlerContext } from "./context.ts";
export type { AnyPgDatabase, WorkTransaction } from "./db/types.ts";
export {
  deliveryBoundMs,
  FENCE_TTL_CLOCK_ALLOWANCE_MS,
  fenceTtlMarginMs,
  type HarnessDeps,
} from "./harness-deps.ts";

import type { Consumer } from "./definition.ts";

export { type Consumer, type ConsumerDefinition, DEFAULT_HANDLER_TIMEOUT_MS, defineConsumer } from "./definition.ts";

/** Binds a consumer to its database and ports; the result is what a transport adapter delivers to. */
export function bindConsumer<TSchema extends z.ZodType>(consumer: Consumer<TSchema>, deps: HarnessDeps): BoundConsumer {
  return new ConsumerRunner(consumer, deps);
}

const DEFAULT_ALERT_FLUSH_TIMEOUT_MS = 5_000;

/** Deferral of a delivery whose handler never started: from about a second, doubling, up to 5 minutes. */
const NOT_STARTED_BASE_MS = 1_000;
const NOT_STARTED_CAP_MS = 300_000;

/**
 * How many unwritten letters a bound consumer remembers. A letter fails to be
 * written only while the database is failing; one per job in flight then
 * covers a busy worker, and it costs a few hundred bytes each.
 */
const UNWRITTEN_LETTERS_REMEMBERED = 4096;

class ConsumerRunner<TSchema extends z.ZodType> implements BoundConsumer {
  readonly name: string;
  readonly queue: string;
  readonly timeoutMs: number;
  readonly deliveryBoundMs: number;
  /** Calls to the metrics port and the logger that threw or rejected (they never change an outcome). */
  readonly observerFailures = new ObserverFailures();
  /** The deliveries a transport kept without spending an attempt (`core.transport_holds`). */
  readonly holds: TransportHolds;
  readonly #consumer: Consumer<TSchema>;
  readonly #db: AnyPgDatabase;
  readonly #runInWorkTransaction: RunInWorkTransaction;
  readonly #alerts: AlertSender;
  readonly #metrics: MetricsPort;
  readonly #logger: Logger;
  readonly #random: () => number;
  readonly #now: () => number;
  /** The consumer's `deferralHorizonMs`; the default for a consumer object made without it (not by defineConsumer). */
  readonly #deferralHorizonMs: number;
  readonly #outboxRelay: { wake(): void } | undefined;
  /** The consumer's rate limits, taken before the work transaction; none without `limits`. */
  readonly #gate: RateGate | undefined;
  /** The consumer's lane (its queue is `notif.{channel}.{lane}`): a marketing one yields, a transactional one settles. */
  readonly #lane: LaneGate | undefined;
  /** A copy older than this since it was due is not run (HarnessDeps.fenceTtlMs less fenceTtlMarginMs). */
  readonly #runnableForMs: number | undefined;
  /** Failures of this consumer's jobs whose dead letter could not be written, by job_id. */
  readonly #unwrittenLetters = new LruMap<string, UnwrittenLetter>(UNWRITTEN_LETTERS_REMEMBERED);
  readonly #attributesByOutcome = new Map<DeliveryOutcome, JobMetricAttributes>();

  constructor(consumer: Consumer<TSchema>, deps: HarnessDeps) {
    if (typeof deps?.db?.transaction !== "function") {
      throw new InvalidConfigError(`consumer "${consumer.name}": deps.db must be a Drizzle Postgres database`);
    }
    this.#consumer = consumer;
    this.name = consumer.name;
    this.queue = consumer.queue;
    this.timeoutMs = consumer.timeoutMs;
    this.deliveryBoundMs = deliveryBoundMs(consumer);
    this.#db = deps.db;
    this.holds = postgresTransportHolds(deps.db, consumer.name, consumer.timeoutMs);
    const pipeline = deps.pipeline !== false;
    this.#runInWorkTransaction =
      consumer.batch === undefined || consumer.batch.maxSize === 1
        ? workTransactionFor(deps.db, { pipeline })
        : batchedWorkTransactionFor(deps.db, { pipeline, batch: consumer.batch });
    // Observers never change an outcome: every call to them is guarded (ports/observers.ts).
    this.#logger = guardedLogger(deps.logger ?? consoleLogger, this.observerFailures);
    this.#metrics = guardedMetrics(deps.metrics ?? noopMetrics, this.observerFailures, this.#logger);
    this.#random = deps.random ?? Math.random;
    this.#now = deps.now ?? Date.now;
    this.#deferralHorizonMs = consumer.deferralHorizonMs ?? DEFAULT_DEFERRAL_HORIZON_MS;
    this.#outboxRelay = deps.outboxRelay;
    const limits = consumer.limits ?? [];
    if (limits.length > 0 && deps.rateLimiter === undefined) {
      throw new InvalidConfigError(
        `consumer "${consumer.name}": it declares rate limits, so bindConsumer needs a rateLimiter (upstashRateLimiter across processes, inProcessRateLimiter in one)`,
      );
    }
    this.#gate =
      limits.length > 0 && deps.rateLimiter
        ? new RateGate(consumer.name, limits, deps.rateLimiter, consumer.timeoutMs, this.#random)
        : undefined;
    this.#lane = LaneGate.of(consumer, deps.laneBacklog, this.#random, this.#logger);
    const alertFlushTimeoutMs = deps.alertFlushTimeoutMs ?? DEFAULT_ALERT_FLUSH_TIMEOUT_MS;
    if (!(Number.isFinite(alertFlushTimeoutMs) && alertFlushTimeoutMs > 0)) {
      throw new InvalidConfigError(
        `consumer "${consumer.name}": alertFlushTimeoutMs must be a positive number of milliseconds, got ${deps.alertFlushTimeoutMs}`,
      );
    }
    this.#alerts = new AlertSender(
      deps.alerts ?? noopAlerts,
      this.#metrics,
      this.#logger,
      { queue: this.queue, consumer: this.name },
      alertFlushTimeoutMs,
    );
    if (deps.fenceTtlMs !== undefined) {
      const margin = fenceTtlMarginMs(consumer);
      if (!(Number.isFinite(deps.fenceTtlMs) && deps.fenceTtlMs > 2 * margin)) {
        throw new InvalidConfigError(
          `consumer "${consumer.name}": fenceTtlMs must be a number of milliseconds above twice its fence TTL margin (${2 * margin} ms: deliveryBoundMs, 2 × timeoutMs + ${ROLLBACK_WAIT_MS} ms, + ${FENCE_TTL_CLOCK_ALLOWANCE_MS} ms for clocks), got ${deps.fenceTtlMs}`,
        );
      }
      this.#runnableForMs = deps.fenceTtlMs - margin;
    }
  }

  get maxAttempts(): number {
    return this.#consumer.retryPolicy.maxAttempts;
  }

  async deadLetterNow(
    delivery: Delivery,
    reason: {
      readonly errorClass: "exhausted" | "expired" | "poison";
      readonly attempts: number;
      readonly error: string;
    },
  ): Promise<DeliveryResult> {
    const decoded = await checkPayload(this.#consumer, delivery.body);
    if (!decoded.ok) return this.#poison(decoded.received, decoded.error, decoded.fields, decoded.alertError);
    const result = await this.#deadLetterUnlessCommitted({
      errorClass: reason.errorClass,
      attempts: Math.max(0, Math.trunc(reason.attempts)),
      error: reason.error,
      received: decoded.received,
      envelope: decoded.envelope,
    });
    if (this.#lane !== undefined && result.ack) await this.#lane.settled(decoded.envelope.job_id);
    return result;
  }

  deliver(delivery: Delivery): Promise<DeliveryResult> {
    delivery = withCountableDeferrals(delivery);
    const outside = new OutsideBudget(this.timeoutMs);
    if (this.#lane?.lane !== "transactional") return this.#deliver(delivery, outside);
    return this.#deliverTransactional(delivery, this.#lane, outside);
  }

  /** A transactional lane's delivery: a final outcome takes the job out of the channel's backlog. */
  async #deliverTransactional(delivery: Delivery, lane: LaneGate, outside: OutsideBudget): Promise<DeliveryResult> {
    const seen: { jobId?: string } = {};
    const result = await this.#deliver(delivery, outside, seen);
    // Acknowledged and not addressed to another consumer: the job is done here, for good.
    if (result.ack && result.outcome !== "skipped" && seen.jobId !== undefined)
      await lane.settled(seen.jobId, outside.left());
    return result;
  }

  async #deliver(delivery: Delivery, outside: OutsideBudget, seen?: { jobId?: string }): Promise<DeliveryResult> {
    const consumer = this.#consumer;
    if (delivery.targetConsumer !== undefined && delivery.targetConsumer !== consumer.name) {
      return this.#finish("skipped", { outcome: "skipped", ack: true });
    }

    // 1. Poison check: nothing invalid ever reaches the handler or the retry loop.
    // A schema's asynchronous checks get half of it: the other half is the
    // poison letter's, if they never finish (else the letter could never be
    // written, and the message would come back for ever).
    let decoded = checkPayload(this.#consumer, delivery.body, Math.ceil(outside.left() / 2));
    if (decoded instanceof Promise) decoded = await decoded;
    if (!decoded.ok) {
      // A poison job with a readable job_id leaves the backlog with its letter; one without goes stale.
      if (seen !== undefined && isJobId(decoded.fields.job_id)) seen.jobId = decoded.fields.job_id;
      return this.#poison(decoded.received, decoded.error, decoded.fields, decoded.alertError, outside);
    }
    const { received, envelope, parsed, lockKey } = decoded;
    if (seen !== undefined) seen.jobId = envelope.job_id;

    const attempt = Number.isInteger(delivery.deliveryCount) && delivery.deliveryCount > 0 ? delivery.deliveryCount : 1;
    const policy = consumer.retryPolicy;

    // A delivery past the budget means earlier ones ended without an
    // acknowledgement: running the handler again could loop forever.
    if (attempt > policy.maxAttempts) {
      return this.#deadLetterUnlessCommitted({ ...this.#pastBudget(attempt, received, envelope), outside });
    }
    // The fence TTL is a law the harness obeys too: a copy this old could
    // outlive the fence it must find, or the one it commits. Replays too:
    // their due time is when they were replayed.
    if (this.#runnableForMs !== undefined) {
      const age = this.#now() - dueAtOf(delivery, envelope);
      if (age > this.#runnableForMs) {
        return this.#deadLetterUnlessCommitted({
          outside,
          errorClass: "expired",
          attempts: attempt - 1,
          error: `job has been due for ${age} ms, past the ${this.#runnableForMs} ms a copy of ${consumer.name}'s jobs may still start within its fence TTL (fenceTtlMs less fenceTtlMarginMs): the handler was not run, because its fence could be cleaned up before the copy finished. If the fence of a copy that committed was already cleaned up, the work was done: check its effect before replaying this letter`,
          received,
          envelope,
        });
      }
    }
    // Age counts from when the message was due (a job scheduled ahead is not
    // old on arrival); a replay an operator asked for is never expired.
    if (consumer.maxAgeMs !== undefined && delivery.replay !== true) {
      const age = this.#now() - dueAtOf(delivery, envelope);
      if (age > consumer.maxAgeMs) {
        return this.#deadLetterUnlessCommitted({
          outside,
          errorClass: "expired",
          attempts: attempt - 1,
          error: `job has been due for ${age} ms, past ${consumer.name}'s maximum age of ${consumer.maxAgeMs} ms`,
          received,
          envelope,
        });
      }
    }

    // A marketing lane gives way to its channel's transactional backlog, before it takes any token.
    if (this.#lane !== undefined) {
      const admitted = await this.#lane.admit(delivery.deferrals ?? 0, outside.left());
      if (!admitted.ok) return this.#yielded(admitted, delivery);
    }
    // Rate limits: a token from each bucket before any connection, lock or fence is taken.
    if (this.#gate) {
      const admitted = await this.#gate.admit(envelope.tenant_id, delivery.deferrals ?? 0, outside.left());
      if (!admitted.ok) return this.#notAdmitted(admitted, delivery);
    }

    // 2. Fence + work in one transaction.
    const started = performance.now();
    let ran: Awaited<ReturnType<RunInWorkTransaction>>;
    let context: Context | undefined;
    try {
      ran = await this.#runInWorkTransaction(
        {
          jobId: envelope.job_id,
          consumer: consumer.name,
          lockKey,
          timeoutMs: consumer.timeoutMs,
          // Deferred before: a batch may have been undone through another job
          // (the mark a batch leaves stays in its process); alone, it is not.
          alone: (delivery.deferrals ?? 0) > 0,
        },
        (tx, signal) => {
          context = new Context(tx, envelope, attempt, consumer.name, signal);
          return consumer.handle(parsed.data, context);
        },
      );
    } catch (thrown) {
      const duration = performance.now() - started;
      if (isInstance(thrown, WorkNotStartedError)) {
        // The handler never ran (no connection, BEGIN, lock or fence failed):
        // no attempt is spent, so a database outage never exhausts a job —
        // until it outlasts the deferral horizon.
        const retryAfterMs = deferralDelayMs(
          delivery.deferrals ?? 0,
          { baseMs: NOT_STARTED_BASE_MS, capMs: NOT_STARTED_CAP_MS },
          this.#random,
        );
        const error = describeError(thrown);
        const beyond = this.#beyondDeferralHorizon(delivery, envelope, retryAfterMs);
        if (beyond !== undefined) {
          this.#metrics.handlerDuration(duration, this.#attributes("dead_lettered"));
          return this.#deadLetterUnlessCommitted({
            outside,
            errorClass: "exhausted",
            attempts: attempt - 1,
            error: `${beyond} (the handler could not start: ${error})`,
            cause: thrown,
            received,
            envelope,
          });
        }
        this.#metrics.handlerDuration(duration, this.#attributes("deferred"));
        return this.#finish("deferred", { outcome: "deferred", ack: false, retryAfterMs, spendsAttempt: false, error });
      }
      // 4. The transaction rolled back: no fence, no effect.
      const failure = classifySafely(thrown);
      if (failure.failureClass === "rate_limited") {
        // Grows with the job's deferrals so far (capped, jittered); a
        // provider's Retry-After is honoured, but never below a 1 s floor —
        // nor beyond the deferral horizon: a copy that slept longer could
        // come back after the fence another copy committed meanwhile was
        // cleaned up (it comes back sooner, and may be told to wait again).
        const retryAfterMs = Math.min(
          deferralDelayMs(
            delivery.deferrals ?? 0,
            { ...RATE_LIMIT_BACKOFF, retryAfterMs: failure.retryAfterMs },
            this.#random,
          ),
          this.#deferralHorizonMs,
        );
        this.#metrics.handlerDuration(duration, this.#attributes("rate_limited"));
        // Every process slows down at once, instead of each finding out by its own 429.
        await this.#gate?.providerSaidWait(retryAfterMs, outside.left());
        return this.#finish("rate_limited", {
          outcome: "rate_limited",
          ack: false,
          retryAfterMs,
          spendsAttempt: false,
          error: failure.message,
        });
      }
      this.#metrics.handlerDuration(
        duration,
        this.#attributes(failure.failureClass === "permanent" ? "dead_lettered" : "retry"),
      );
      if (failure.failureClass === "permanent" || attempt >= policy.maxAttempts) {
        // Serialised with any other delivery of the job: one still committing
        // makes this a duplicate, never a letter beside a fence.
        return this.#deadLetterUnlessCommitted({
          outside,
          errorClass: failure.failureClass === "permanent" ? "permanent" : "exhausted",
          attempts: attempt,
          error: failure.message,
          cause: thrown,
          received,
          envelope,
        });
      }
      return this.#finish("retry", {
        outcome: "retry",
        ack: false,
        retryAfterMs: retryDelayMs(policy, attempt, this.#random),
        spendsAttempt: true,
        error: failure.message,
      });
    }
    const duration = performance.now() - started;
    if (ran.status === "dead_lettered") {
      // A concurrent delivery dead-lettered the job while this one ran: the
      // work was rolled back, the letter stands.
      this.#metrics.handlerDuration(duration, this.#attributes("dead_lettered"));
      return this.#finish("dead_lettered", {
        outcome: "dead_lettered",
        ack: true,
        deadLetterId: ran.deadLetterId,
        errorClass: ran.errorClass,
      });
    }
    // The jobs this one wrote to the outbox exist now: have them published.
    if (ran.status === "committed" && context?.wroteOutbox) {
      try {
        this.#outboxRelay?.wake();
      } catch (thrown) {
        // The job committed: a wake that throws must not turn that into a
        // failure (redelivered, a duplicate). The relay's poll finds the rows.
        this.#logger.warn(`outbox relay wake() failed; the job's outcome stands: ${describeError(thrown)}`, {
          consumer: this.name,
          jobId: envelope.job_id,
        });
      }
    }
    // 3. Duplicate: acknowledged silently, counted.
    const outcome = ran.status === "committed" ? "success" : "duplicate";
    this.#metrics.handlerDuration(duration, this.#attributes(outcome));
    return this.#finish(outcome, { outcome, ack: true });
  }

  /**
   * The dead letter of a delivery past the budget. Only this process can know
   * why the earlier attempts ended (it remembers failures whose letter could
   * not be written); otherwise it says that it does not know.
   */
  #pastBudget(
    attempt: number,
    received: ReceivedPayload,
    envelope: Envelope,
  ): DeadLetterInput & { envelope: Envelope } {
    const known = this.#unwrittenLetters.get(envelope.job_id);
    if (known) {
      return {
        errorClass: known.errorClass,
        attempts: known.attempts,
        error: `${known.error} (written by delivery ${attempt}, past the budget of ${this.#consumer.retryPolicy.maxAttempts} attempts, without running the handler again: this dead letter could not be written when the failure happened)`,
        received,
        envelope,
        evidence: "remembered",
      };
    }
    return {
      errorClass: "exhausted",
      attempts: attempt - 1,
      error: `delivery ${attempt} is past the budget of ${this.#consumer.retryPolicy.maxAttempts} attempts; the handler was not run again. The outcome of the earlier attempts is unknown: they crashed or timed out the worker, or they failed and their dead letter could not be written`,
      received,
      envelope,
      evidence: "unknown",
    };
  }

  /**
   * Why a deferral of `waitMs` would bring the job back past the consumer's
   * deferral horizon, or undefined when it would not. A delivery whose
   * handler never started never reached the fence either, and such deferrals
   * spend no attempt and may repeat without end (a long outage, a pool that
   * stays exhausted): this bounds how late such a copy can still run the
   * handler — after the fence another copy committed may have been cleaned up.
   */
  /**
   * A delivery its limits did not admit: no token → `rate_limited` until the
   * bucket has one (never past the deferral horizon); a limiter that could
   * not answer → `deferred`, as a database that could not (never a
   * pass-through). Neither spends an attempt; the handler never started.
   */
  #notAdmitted(admitted: Exclude<Admission, { ok: true }>, delivery: Delivery): DeliveryResult {
    if (admitted.limited) {
      return this.#finish("rate_limited", {
        outcome: "rate_limited",
        ack: false,
        retryAfterMs: Math.min(admitted.retryAfterMs, this.#deferralHorizonMs),
        spendsAttempt: false,
        error: admitted.error,
      });
    }
    const retryAfterMs = deferralDelayMs(
      delivery.deferrals ?? 0,
      { baseMs: NOT_STARTED_BASE_MS, capMs: NOT_STARTED_CAP_MS },
      this.#random,
    );
    return this.#finish("deferred", {
      outcome: "deferred",
      ack: false,
      retryAfterMs,
      spendsAttempt: false,
      error: admitted.error,
    });
  }

  /**
   * A marketing delivery that gave way to the transactional backlog
   * (`yielded`, never past the deferral horizon), or whose backlog could not
   * be read (`deferred`, as a limiter that could not answer). Neither spends
   * an attempt.
   */
  #yielded(admitted: Exclude<LaneAdmission, { ok: true }>, delivery: Delivery): DeliveryResult {
    if (admitted.yielded) {
      return this.#finish("yielded", {
        outcome: "yielded",
        ack: false,
        retryAfterMs: Math.min(admitted.retryAfterMs, this.#deferralHorizonMs),
        spendsAttempt: false,
        error: admitted.error,
      });
    }
    return this.#notAdmitted({ ok: false, limited: false, error: admitted.error }, delivery);
  }

  #beyondDeferralHorizon(delivery: Delivery, envelope: Envelope, waitMs: number): string | undefined {
    const dueAt = dueAtOf(delivery, envelope);
    const horizon = this.#deferralHorizonMs;
    const backAfter = this.#now() + waitMs - dueAt;
    if (!(backAfter > horizon)) return undefined;
    return `deferred past its horizon: a wait of ${waitMs} ms would bring the job back ${backAfter} ms after it was due, beyond ${this.name}'s deferral horizon of ${horizon} ms`;
  }

  /** The same (frozen) attributes object for every job of one outcome: no object made per job. */
  #attributes(outcome: DeliveryOutcome): JobMetricAttributes {
    let attributes = this.#attributesByOutcome.get(outcome);
    if (attributes === undefined) {
      attributes = Object.freeze({ queue: this.queue, consumer: this.name, outcome });
      this.#attributesByOutcome.set(outcome, attributes);
    }
    return attributes;
  }

  #finish<R extends DeliveryResult>(outcome: DeliveryOutcome, result: R): R {
    this.#metrics.jobProcessed(this.#attributes(outcome));
    return result;
  }

  /**
   * For dead letters of jobs that may have a fence: decided under the fence
   * key (`decideDeadLetter`), so a job whose fence exists or is being
   * committed right now is a duplicate (its ack was lost, or another delivery
   * is finishing it), and a letter is never written beside a fence. If the
   * decision fails, the delivery is not acknowledged.
   */
  async #deadLetterUnlessCommitted(
    input: DeadLetterInput,
    jobId: string | undefined = input.envelope.job_id,
  ): Promise<DeliveryResult> {
    if (jobId === undefined) return this.#deadLetter(input);
    let decided: Awaited<ReturnType<typeof decideDeadLetter<DeadLetterWrite>>>;
    try {
      decided = await decideDeadLetter(
        this.#db,
        { jobId, consumer: this.name, timeoutMs: this.timeoutMs, withinMs: input.outside?.left() },
        (tx) => this.#writeDeadLetter(input, tx),
        // Committed after the decision gave up: this delivery is not
        // acknowledged, and its redelivery only finds the letter; it is new
        // all the same, and alerts now.
        (late) => this.#letterWritten(input, late),
      );
    } catch (thrown) {
      return this.#deadLetterFailed(`dead letter could not be written: ${describeError(thrown)}`, input);
    }
    if (decided.status === "duplicate") return this.#finish("duplicate", { outcome: "duplicate", ack: true });
    return this.#afterDeadLetter(input, decided.value);
  }

  #deadLetterFailed(message: string, input: DeadLetterInput): DeliveryResult {
    // Remembered so that the delivery past the budget can still tell the real
    // cause (poison needs no memory: the payload says it again every time).
    const jobId = input.envelope.job_id;
    if (jobId !== undefined && input.errorClass !== "poison" && input.evidence === undefined) {
      const error = boundedText(this.#withUnwrittenEvidence(input), LAST_ERROR_MAX) ?? input.error;
      this.#unwrittenLetters.set(jobId, { errorClass: input.errorClass, attempts: input.attempts, error });
    }
    this.#logger.error(message, {
      queue: this.queue,
      consumer: this.name,
      jobId: input.envelope.job_id,
      errorClass: input.errorClass,
    });
    return this.#finish("dead_letter_failed", { outcome: "dead_letter_failed", ack: false, error: message });
  }

  /**
   * The error a letter records: this delivery's, and an earlier failure of
   * the same job whose letter could not be written, when it said something
   * else (a `permanent` rejection followed by a transient failure on a later
   * attempt): neither cause is dropped.
   */
  #withUnwrittenEvidence(input: DeadLetterInput): string {
    const jobId = input.envelope.job_id;
    if (input.evidence !== undefined || jobId === undefined) return input.error;
    const earlier = this.#unwrittenLetters.get(jobId);
    if (!earlier || (earlier.errorClass === input.errorClass && earlier.error === input.error)) return input.error;
    return `${input.error} (earlier, after attempt ${earlier.attempts}, a ${earlier.errorClass} dead letter could not be written: ${earlier.error})`;
  }

  #poison(
    received: ReceivedPayload,
    error: string,
    fields: DeadLetterInput["envelope"],
    alertError?: string,
    outside?: OutsideBudget,
  ): Promise<DeliveryResult> {
    const input: DeadLetterInput = {
      errorClass: "poison",
      attempts: 0,
      error,
      received,
      envelope: fields,
      ...(alertError === undefined ? {} : { alertError }),
      ...(outside === undefined ? {} : { outside }),
    };
    // A readable job id is the fence's key: a copy of a job that committed
    // (a corrupted copy, a schema made stricter since) is a duplicate, and a
    // copy running right now decides first. Never a pending letter beside a
    // committed fence (SPEC §4). Without one, no fence can exist.
    const jobId = fields.job_id;
    return isJobId(jobId) ? this.#deadLetterUnlessCommitted(input, jobId.toLowerCase()) : this.#deadLetter(input);
  }

  /**
   * Writes the dead letter, or says the delivery must not be acknowledged: a
   * dead letter that was not written is a job that must come back.
   */
  async #deadLetter(input: DeadLetterInput): Promise<DeliveryResult> {
    let written: DeadLetterWrite;
    const writing = this.#writeDeadLetter(input, this.#db);
    try {
      // Bounded like the decision: a pool that stays exhausted must not hold
      // the delivery past its visibility timeout (a late write is the same
      // bytes' letter, which the redelivery folds into; new, it alerts then).
      const ms = input.outside?.left() ?? this.timeoutMs;
      written = await withinMs(writing, ms, () => {
        writing.then((late) => this.#letterWritten(input, late), noop);
        const left = ms < this.timeoutMs ? `, all the delivery had left of it (${ms} ms)` : "";
        return new Error(`the letter was not written within timeoutMs (${this.timeoutMs} ms)${left}`);
      });
    } catch (thrown) {
      return this.#deadLetterFailed(`dead letter could not be written: ${describeError(thrown)}`, input);
    }
    return this.#afterDeadLetter(input, written);
  }

  /** Writes the letter (`upsertDeadLetter`: copies of the same bytes fold, other payloads are kept); throws when it cannot. */
  async #writeDeadLetter(input: DeadLetterInput, executor: AnyPgDatabase | WorkTransaction): Promise<DeadLetterWrite> {
    const error = boundedText(this.#withUnwrittenEvidence(input), LAST_ERROR_MAX) ?? "unknown error";
    const jobId = isJobId(input.envelope.job_id) ? input.envelope.job_id.toLowerCase() : null;
    const row = {
      jobId,
      tenantId: boundedText(input.envelope.tenant_id, ENVELOPE_FIELD_MAX),
      correlationId: boundedText(input.envelope.correlation_id, ENVELOPE_FIELD_MAX),
      kind: boundedText(input.envelope.kind, ENVELOPE_FIELD_MAX),
    };
    const written = await upsertDeadLetter(executor, {
      jobId,
      queue: this.queue,
      consumer: this.name,
      payload: input.received.text,
      payloadEncoding: input.received.encoding,
      payloadSha256: payloadSha256(input.received),
      // A transport's count can be any integer; the column is int4.
      attempts: Math.min(input.attempts, MAX_ATTEMPTS_STORED),
      lastError: error,
      errorClass: input.errorClass,
      tenantId: row.tenantId,
      correlationId: row.correlationId,
      kind: row.kind,
    });
    return { id: written.id, inserted: written.inserted, row, error };
  }

  #afterDeadLetter(input: DeadLetterInput, written: DeadLetterWrite): DeliveryResult {
    const outcome = input.errorClass === "poison" ? "poison" : "dead_lettered";
    this.#letterWritten(input, written);
    return this.#finish(outcome, { outcome, ack: true, deadLetterId: written.id, errorClass: input.errorClass });
  }

  /** A letter is written: nothing of it left to remember, and a new one alerts. */
  #letterWritten(input: DeadLetterInput, written: DeadLetterWrite): void {
    const { row, error } = written;
    if (input.envelope.job_id !== undefined) this.#unwrittenLetters.delete(input.envelope.job_id);
    if (written.inserted) {
      this.#alerts.send({
        deadLetterId: written.id,
        jobId: row.jobId,
        queue: this.queue,
        consumer: this.name,
        tenantId: row.tenantId,
        kind: row.kind,
        correlationId: row.correlationId,
        errorClass: input.errorClass,
        attempts: input.attempts,
        // Redacted: no value quoted in the error leaves the database (the row keeps the full text).
        ...alertErrorFields(input.alertError ?? error, input.cause),
      });
    }
  }

  /** Resolves once this consumer's alerts reached the sink (or gave up after `alertFlushTimeoutMs`). */
  flushAlerts(): Promise<void> {
    return this.#alerts.flush();
  }
}

const noop = () => {};
