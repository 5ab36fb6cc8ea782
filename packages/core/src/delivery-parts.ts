/**
 * The parts of one delivery that `consumer.ts` (`ConsumerRunner`) passes
 * between its steps, and the small rules they follow: what a dead letter is
 * written from, the budget outside the work transaction, the counts a
 * transport gives made safe to compute with, the job's due time.
 */
import type { DeadLetterErrorClass } from "./db/schema.ts";
import { type Envelope, jobCreatedAt } from "./envelope.ts";
import { classifyFailure } from "./errors.ts";
import type { EnvelopeFields, ReceivedPayload } from "./payload.ts";
import type { Delivery } from "./queue-port.ts";

export type DeadLetterInput = {
  errorClass: DeadLetterErrorClass;
  attempts: number;
  error: string;
  /** What the handler threw, if it threw: the alert reads its SQLSTATE and names. */
  cause?: unknown;
  received: ReceivedPayload;
  envelope: EnvelopeFields;
  /**
   * Where the cause comes from, when it is not this delivery: `remembered`, a
   * failure whose letter could not be written earlier; `unknown`, nobody here
   * knows (a delivery past the budget). @default this delivery
   */
  evidence?: "remembered" | "unknown";
  /** What is left of the delivery's budget outside its work transaction (`OutsideBudget`). @default a whole timeoutMs */
  outside?: OutsideBudget;
  /**
   * What the alert may say instead of `error`, when `error` quotes whatever
   * a schema or key function threw (its message can hold payload values
   * unquoted, e.g. "Cannot convert 12x to a BigInt"): the stage and the
   * exception's class only. @default error, redacted
   */
  alertError?: string;
};

/** What writing a dead letter returned: its id, whether it is new (alert) or one more occurrence, and what was stored. */
export interface DeadLetterWrite {
  readonly id: string;
  readonly inserted: boolean;
  readonly row: {
    readonly jobId: string | null;
    readonly tenantId: string | null;
    readonly kind: string | null;
    readonly correlationId: string | null;
  };
  readonly error: string;
}

/** What a failed dead-letter write would have said; see `ConsumerRunner.#unwrittenLetters`. */
export type UnwrittenLetter = Pick<DeadLetterInput, "errorClass" | "attempts" | "error">;

/**
 * What one delivery may spend outside its work transaction, all stages
 * together: before it, a schema's asynchronous checks and the lane's and the
 * rate gate's answers; after it, the dead-letter decision (or a letter's
 * write), a provider's wait and the transactional lane's settling. One
 * `timeoutMs`: the one `deliveryBoundMs` counts besides the run (was: each
 * stage had a whole `timeoutMs` of its own, and a slow limiter and a slow
 * decision together made a delivery outlast its bound, so the transport
 * delivered it again while it still ran).
 */
export class OutsideBudget {
  readonly #ends: number;
  constructor(ms: number) {
    this.#ends = performance.now() + ms;
  }
  /** Milliseconds left, at least 1: a stage that gets 1 ms gives up at once, as it would have past its own bound. */
  left(): number {
    return Math.max(1, Math.floor(this.#ends - performance.now()));
  }
}

/**
 * The delivery with a `deferrals` every wait can grow from: a whole number
 * from 0 (a transport's NaN, negative or fractional count would make a wait
 * of NaN, which a timer runs at once).
 */
export function withCountableDeferrals(delivery: Delivery): Delivery {
  const deferrals = delivery.deferrals;
  if (deferrals === undefined || (Number.isSafeInteger(deferrals) && deferrals >= 0)) return delivery;
  return { ...delivery, deferrals: deferrals > 0 ? Math.min(Math.trunc(deferrals), Number.MAX_SAFE_INTEGER) : 0 };
}

/** Largest `attempts` a letter stores (`core.dead_letters.attempts` is an integer column). */
export const MAX_ATTEMPTS_STORED = 2_147_483_647;

/** When the job became due: the transport's `dueAt` (publish time plus delay), else its job_id's timestamp. */
export function dueAtOf(delivery: Delivery, envelope: Envelope): number {
  return typeof delivery.dueAt === "number" && Number.isFinite(delivery.dueAt)
    ? delivery.dueAt
    : jobCreatedAt(envelope.job_id);
}

/** `classifyFailure`, and a transient failure for a thrown value that throws when read (hostile getters). */
export function classifySafely(thrown: unknown): ReturnType<typeof classifyFailure> {
  try {
    return classifyFailure(thrown);
  } catch {
    return { failureClass: "transient", message: "the handler threw a value that cannot be read" };
  }
}
