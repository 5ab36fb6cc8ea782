/**
 * Errors of @softcrum/core. Each carries a string `code` and is recognised by
 * that code (see `isSoftcrumError`), not only by `instanceof`: a package that
 * is loaded twice (two copies in node_modules) breaks `instanceof`.
 */

export type SoftcrumErrorCode =
  | "INVALID_ENVELOPE"
  | "INVALID_CONFIG"
  | "PERMANENT"
  | "RATE_LIMITED"
  | "QUEUE_CLOSED"
  | "INVALID_INPUT"
  | "NOT_FOUND"
  | "CONFLICT"
  | "UNAUTHENTICATED"
  | "FORBIDDEN";

const BRAND = "@softcrum/core:error";

export class SoftcrumError extends Error {
  readonly [BRAND] = true;
  readonly code: SoftcrumErrorCode;

  constructor(code: SoftcrumErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** True for any error thrown by @softcrum/core, whichever copy of the package made it. */
export function isSoftcrumError(error: unknown, code?: SoftcrumErrorCode): error is SoftcrumError {
  if (typeof error !== "object" || error === null) return false;
  const tagged = (error as Record<string, unknown>)[BRAND] === true;
  return tagged && (code === undefined || (error as SoftcrumError).code === code);
}

/** An envelope (or a value offered as one) failed validation. `issues` lists every problem. */
export class InvalidEnvelopeError extends SoftcrumError {
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super("INVALID_ENVELOPE", `invalid job envelope: ${issues.join("; ")}`);
    this.issues = issues;
  }
}

/** A consumer, policy or adapter was configured in a way that cannot work. Thrown at definition/bind time. */
export class InvalidConfigError extends SoftcrumError {
  constructor(message: string) {
    super("INVALID_CONFIG", message);
  }
}

/**
 * Throw from a handler when retrying cannot help: a business rejection, a
 * record that will never exist. The job is dead-lettered at once (class
 * `permanent`) instead of spending its retry budget.
 */
export class PermanentError extends SoftcrumError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("PERMANENT", message, options);
  }
}

/**
 * Throw from a handler when a provider said "slow down" (HTTP 429) or a rate
 * limit gate refused. The job comes back after `retryAfterMs` (or the policy's
 * base delay) and the attempt is NOT counted against the retry budget: a rate
 * limit never discards work.
 */
export class RateLimitedError extends SoftcrumError {
  readonly retryAfterMs: number | undefined;
  constructor(message: string, options?: { retryAfterMs?: number; cause?: unknown }) {
    super("RATE_LIMITED", message, options);
    this.retryAfterMs = validDelay(options?.retryAfterMs);
  }
}

/**
 * An operator action that cannot be done as asked. `code` says why:
 * INVALID_INPUT (bad filter, missing reason), NOT_FOUND, CONFLICT (the state
 * does not allow it), UNAUTHENTICATED, FORBIDDEN.
 */
export class OpsError extends SoftcrumError {
  constructor(code: "INVALID_INPUT" | "NOT_FOUND" | "CONFLICT" | "UNAUTHENTICATED" | "FORBIDDEN", message: string) {
    super(code, message);
  }
}

export class QueueClosedError extends SoftcrumError {
  constructor(message = "the queue adapter is closed") {
    super("QUEUE_CLOSED", message);
  }
}

/** How the harness treats a failure thrown by a handler. */
export type FailureClass = "transient" | "permanent" | "rate_limited";

export interface ClassifiedFailure {
  readonly failureClass: FailureClass;
  readonly message: string;
  /** Only for `rate_limited`: what the provider asked for (Retry-After), when it said. */
  readonly retryAfterMs?: number | undefined;
}

/**
 * Turns anything a handler threw into the harness's view of it. Recognises
 * the errors above by code, and HTTP-style errors that carry `status` /
 * `statusCode` 429 (fetch wrappers, provider SDKs) with an optional
 * `retryAfter` (seconds) or `retryAfterMs`. Everything else is transient:
 * retrying an unknown failure is safe because the fence makes it idempotent.
 */
export function classifyFailure(thrown: unknown): ClassifiedFailure {
  const message = describeError(thrown);
  if (isSoftcrumError(thrown, "PERMANENT")) return { failureClass: "permanent", message };
  if (isSoftcrumError(thrown, "RATE_LIMITED")) {
    return {
      failureClass: "rate_limited",
      message,
      retryAfterMs: validDelay((thrown as RateLimitedError).retryAfterMs),
    };
  }
  if (typeof thrown === "object" && thrown !== null) {
    const e = thrown as Record<string, unknown>;
    const status = e["status"] ?? e["statusCode"];
    if (status === 429) {
      return { failureClass: "rate_limited", message, retryAfterMs: retryAfterFrom(e) };
    }
  }
  return { failureClass: "transient", message };
}

/** Longest Retry-After honoured: a provider asking for more gets this, then asks again. */
export const MAX_RETRY_AFTER_MS = 24 * 3_600_000;

/** A usable delay in ms, or undefined for anything else (NaN, negative, infinite). */
function validDelay(ms: unknown): number | undefined {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) return undefined;
  return Math.min(ms, MAX_RETRY_AFTER_MS);
}

/** `retryAfterMs`, or `retryAfter` as seconds or an HTTP date (RFC 9110 Retry-After). */
function retryAfterFrom(e: Record<string, unknown>): number | undefined {
  const ms = validDelay(e["retryAfterMs"]);
  if (ms !== undefined) return ms;
  const value = e["retryAfter"];
  if (typeof value === "number") return validDelay(value * 1000);
  if (typeof value !== "string") return undefined;
  if (/^\d+$/.test(value.trim())) return validDelay(Number(value) * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : validDelay(Math.max(0, at - Date.now()));
}

/** A one-line description of anything thrown: `Name: message`, never `[object Object]`. */
export function describeError(thrown: unknown): string {
  if (isWrappedQueryError(thrown)) {
    // Drizzle's wrapper puts the query's parameters in its message: they may
    // hold personal data, and dead letters and alerts must not copy them.
    return `${describeError(thrown.cause)} [query: ${thrown.query.slice(0, 300)}]`;
  }
  if (thrown instanceof Error) return `${thrown.name}: ${thrown.message}`;
  if (typeof thrown === "string") return thrown;
  try {
    return `non-error thrown: ${JSON.stringify(thrown)}`;
  } catch {
    return `non-error thrown: ${String(thrown)}`;
  }
}

function isWrappedQueryError(thrown: unknown): thrown is Error & { query: string; cause: unknown } {
  return (
    thrown instanceof Error &&
    typeof (thrown as { query?: unknown }).query === "string" &&
    "params" in thrown &&
    thrown.cause !== undefined
  );
}
