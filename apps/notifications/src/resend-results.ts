/**
 * What a Resend SDK call's result means to the harness. The SDK never throws
 * for an HTTP answer: it resolves `{ data, error, headers }`, with `error` the
 * API's own `{ statusCode, name, message }` (statusCode null when no answer
 * came). A handler that only looked at `data` would take a 429 for an empty
 * success, so every call goes through `sentOrThrow`:
 * - 429 (`rate_limit_exceeded`, and the daily / monthly quotas) →
 *   `RateLimitedError` with the Retry-After: deferred without spending an
 *   attempt, and the provider's bucket waits in every process;
 * - no answer, 5xx, 408, or the same key still in flight elsewhere
 *   (`concurrent_idempotent_requests`) → `ResendUnavailableError`: retried;
 * - any other 4xx (validation, a bad address, an idempotency key reused with
 *   another request) → `PermanentError`: the same request can only fail the
 *   same way, so it is dead-lettered at once.
 */
import { PermanentError, RateLimitedError } from "@softcrum/core";

/** The API's error body, as the SDK hands it over. */
export interface ResendApiError {
  readonly message: string;
  readonly statusCode: number | null;
  readonly name: string;
}

/** The shape every SDK call resolves with. */
export interface ResendResult<T> {
  readonly data: T | null;
  readonly error: ResendApiError | null;
  readonly headers: Record<string, string> | null;
}

/** How long a quota 429 without a Retry-After waits before asking again. */
export const QUOTA_WAIT_MS = 3_600_000;

const QUOTA_NAMES = new Set(["daily_quota_exceeded", "monthly_quota_exceeded"]);
const RETRYABLE_STATUS = new Set([408]);
const RETRYABLE_NAMES = new Set(["concurrent_idempotent_requests", "application_error", "internal_server_error"]);

/** Resend did not answer, or answered that it could not do it now: worth another attempt. */
export class ResendUnavailableError extends Error {
  constructor(
    message: string,
    readonly statusCode: number | null,
    readonly providerCode: string,
  ) {
    super(message);
    this.name = "ResendUnavailableError";
  }
}

/** The call's data, or the error the harness should see (see the file's comment). */
export function sentOrThrow<T>(result: ResendResult<T>, call: string): T {
  if (result.error === null && result.data !== null) return result.data;
  const error = result.error ?? { statusCode: null, name: "application_error", message: "neither data nor an error" };
  const status = typeof error.statusCode === "number" ? error.statusCode : null;
  const text = `Resend ${call}: ${status ?? "no answer"} ${error.name}: ${error.message}`;
  if (status === 429 || error.name === "rate_limit_exceeded" || QUOTA_NAMES.has(error.name)) {
    const retryAfterMs = retryAfterMsOf(result.headers) ?? (QUOTA_NAMES.has(error.name) ? QUOTA_WAIT_MS : undefined);
    throw new RateLimitedError(text, retryAfterMs === undefined ? {} : { retryAfterMs });
  }
  if (status === null || status >= 500 || RETRYABLE_STATUS.has(status) || RETRYABLE_NAMES.has(error.name)) {
    throw new ResendUnavailableError(text, status, error.name);
  }
  if (status >= 400) throw new PermanentError(text);
  throw new ResendUnavailableError(text, status, error.name);
}

/** Retry-After as seconds or an HTTP date (RFC 9110), from the SDK's lowercased header object. */
export function retryAfterMsOf(headers: Record<string, string> | null, now: number = Date.now()): number | undefined {
  const value = headers?.["retry-after"]?.trim();
  if (value === undefined || value === "") return undefined;
  if (/^\d+(\.\d+)?$/.test(value)) return Math.round(Number(value) * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
