/**
 * Errors of @softcrum/core. Each carries a string `code` and is recognised by
 * that code (see `isSoftcrumError`), not only by `instanceof`: a package that
 * is loaded twice (two copies in node_modules) breaks `instanceof`.
 */
import { LAST_ERROR_MAX } from "./db/schema.ts";

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
  | "FORBIDDEN"
  | "NOT_ROUTABLE"
  | "PAYLOAD_TOO_LARGE";

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
  const tagged = read(error, BRAND) === true;
  return tagged && (code === undefined || read(error, "code") === code);
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
 * does not allow it), UNAUTHENTICATED, FORBIDDEN, PAYLOAD_TOO_LARGE (an HTTP
 * body past the handler's limit).
 */
export class OpsError extends SoftcrumError {
  constructor(
    code: "INVALID_INPUT" | "NOT_FOUND" | "CONFLICT" | "UNAUTHENTICATED" | "FORBIDDEN" | "PAYLOAD_TOO_LARGE",
    message: string,
  ) {
    super(code, message);
  }
}

/**
 * A replay the operator tooling cannot deliver to its consumer: no transport
 * here knows the letter's queue and consumer (not in the replay registry), or
 * the only transport is in-process and that consumer does not run in this
 * process. The letter stays `pending_review`.
 */
export class ReplayNotRoutableError extends SoftcrumError {
  constructor(
    readonly queue: string,
    readonly consumer: string,
    reason: string,
  ) {
    super("NOT_ROUTABLE", `cannot route a replay to consumer "${consumer}" of queue "${queue}": ${reason}`);
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
 * Turns anything a handler threw into the harness's view of it. Reads the
 * error and what it wraps — its `cause` chain and an AggregateError's
 * members, breadth first, to `CHAIN_DEPTH` levels, cycle-safe — because
 * fetch, SDKs and handlers wrap the failure that decides: `fetch failed`
 * caused by a 429, a `Promise.any` whose attempts were all throttled.
 *
 * Recognised, wherever they are: the errors above by code; HTTP-style errors
 * with `status` / `statusCode` 429 or a `response.status` 429 (fetch
 * wrappers, axios, provider SDKs), AWS SDK v3 throttling (`$metadata.httpStatusCode`
 * 429, `$retryable.throttling`, name ThrottlingException / TooManyRequestsException).
 * Retry-After comes from `retryAfterMs`, `retryAfter` (seconds or an HTTP date)
 * or a `retry-after` header (`headers` or `response.headers`, plain or a
 * fetch `Headers`). The shallowest error that decides wins; at the same depth
 * a rate limit wins over a permanent error (waiting never discards work).
 * Everything else is transient: retrying an unknown failure is safe because
 * the fence makes it idempotent.
 */
export function classifyFailure(thrown: unknown): ClassifiedFailure {
  const message = describeError(thrown);
  let permanent = false;
  for (const level of errorLevels(thrown)) {
    for (const node of level) {
      const limited = rateLimitOf(node);
      if (limited) return { failureClass: "rate_limited", message, retryAfterMs: limited.retryAfterMs };
      if (isSoftcrumError(node, "PERMANENT")) permanent = true;
    }
    if (permanent) return { failureClass: "permanent", message };
  }
  return { failureClass: "transient", message };
}

/** How deep the cause chain and AggregateError members are read. */
export const CHAIN_DEPTH = 8;
/** Most errors read from one chain (an AggregateError of thousands is not walked whole). */
const CHAIN_NODES = 64;

/** A property, or undefined when reading it throws (a hostile getter, a revoked proxy). */
function read(value: unknown, key: string): unknown {
  if ((typeof value !== "object" && typeof value !== "function") || value === null) return undefined;
  try {
    return (value as Record<string, unknown>)[key];
  } catch {
    return undefined;
  }
}

/**
 * The members of an AggregateError (or a look-alike named so), else none:
 * another error's `errors` may be anything (a validation library's issues).
 */
function membersOf(node: unknown): unknown[] | undefined {
  let aggregate = false;
  try {
    aggregate = node instanceof AggregateError || (isError(node) && read(node, "name") === "AggregateError");
  } catch {}
  if (!aggregate) return undefined;
  const errors = read(node, "errors");
  return Array.isArray(errors) ? errors : undefined;
}

/** What an error wraps: its `cause`, then an AggregateError's members. */
function wrapped(node: unknown): unknown[] {
  const out: unknown[] = [];
  const cause = read(node, "cause");
  if (cause !== undefined && cause !== null) out.push(cause);
  const errors = membersOf(node);
  try {
    if (Array.isArray(errors))
      for (const e of errors.slice(0, CHAIN_NODES)) if (e !== undefined && e !== null) out.push(e);
  } catch {}
  return out;
}

/** The error, then what it wraps, level by level: bounded in depth and count, each object once. */
function errorLevels(thrown: unknown): unknown[][] {
  const seen = new Set<unknown>([thrown]);
  const levels: unknown[][] = [[thrown]];
  let count = 1;
  for (let depth = 1; depth <= CHAIN_DEPTH && count < CHAIN_NODES; depth++) {
    const next: unknown[] = [];
    for (const node of levels[depth - 1] as unknown[]) {
      for (const inner of wrapped(node)) {
        if (count >= CHAIN_NODES) break;
        if (typeof inner === "object" && seen.has(inner)) continue;
        seen.add(inner);
        next.push(inner);
        count += 1;
      }
    }
    if (next.length === 0) break;
    levels.push(next);
  }
  return levels;
}

const THROTTLING_NAMES = new Set(["ThrottlingException", "TooManyRequestsException"]);

/** Whether this one error (not what it wraps) says "slow down", and for how long. */
function rateLimitOf(node: unknown): { retryAfterMs: number | undefined } | undefined {
  if (typeof node !== "object" || node === null) return undefined;
  if (isSoftcrumError(node, "RATE_LIMITED")) {
    return { retryAfterMs: validDelay(read(node, "retryAfterMs")) };
  }
  const response = read(node, "response");
  const metadata = read(node, "$metadata");
  const throttled =
    is429(read(node, "status")) ||
    is429(read(node, "statusCode")) ||
    is429(read(response, "status")) ||
    is429(read(metadata, "httpStatusCode")) ||
    read(read(node, "$retryable"), "throttling") === true ||
    THROTTLING_NAMES.has(read(node, "name") as string);
  if (!throttled) return undefined;
  return {
    retryAfterMs:
      retryAfterFrom(node) ??
      retryAfterHeader(read(node, "headers")) ??
      retryAfterHeader(read(response, "headers")) ??
      retryAfterHeader(read(read(node, "$response"), "headers")),
  };
}

const is429 = (status: unknown) => status === 429 || status === "429";

/** Longest Retry-After honoured: a provider asking for more gets this, then asks again. */
export const MAX_RETRY_AFTER_MS = 24 * 3_600_000;

/** A usable delay in ms, or undefined for anything else (NaN, negative, infinite). */
function validDelay(ms: unknown): number | undefined {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) return undefined;
  return Math.min(ms, MAX_RETRY_AFTER_MS);
}

/** `retryAfterMs`, or `retryAfter` as seconds or an HTTP date (RFC 9110 Retry-After). */
function retryAfterFrom(e: object): number | undefined {
  const ms = validDelay(read(e, "retryAfterMs"));
  if (ms !== undefined) return ms;
  return retryAfterValue(read(e, "retryAfter"));
}

/** A Retry-After value: seconds (a number or digits) or an HTTP date. */
function retryAfterValue(value: unknown): number | undefined {
  if (typeof value === "number") return validDelay(value * 1000);
  if (typeof value !== "string") return undefined;
  if (/^\d+$/.test(value.trim())) return validDelay(Number(value) * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : validDelay(Math.max(0, at - Date.now()));
}

/** The `retry-after` header of a fetch `Headers` or a plain header object (any case). */
function retryAfterHeader(headers: unknown): number | undefined {
  if (typeof headers !== "object" || headers === null) return undefined;
  const get = read(headers, "get");
  if (typeof get === "function") {
    try {
      return retryAfterValue((get as (name: string) => unknown).call(headers, "retry-after") ?? undefined);
    } catch {
      return undefined;
    }
  }
  return retryAfterValue(read(headers, "retry-after") ?? read(headers, "Retry-After"));
}

/**
 * A one-line description of anything thrown, never `[object Object]`, with
 * what it wraps: `TypeError: fetch failed ← caused by Error: connect
 * ECONNREFUSED 127.0.0.1:1 (code ECONNREFUSED)`; an AggregateError lists its
 * members (`[2 errors: (1) …; (2) …]`). A cause whose message its wrapper
 * already quotes is named without repeating it. Bounded: `CHAIN_DEPTH`
 * levels, each error once (cycles end), `LAST_ERROR_MAX` characters. Never
 * throws, whatever getters the error has.
 *
 * A Drizzle query error is described by its cause plus the query, never its
 * own message: that holds the query's parameters, which may be personal data
 * dead letters and alerts must not copy. The query goes last (`[query: …]`),
 * where `redactErrorMessage` expects SQL.
 */
export function describeError(thrown: unknown): string {
  try {
    const state = {
      seen: new Set<unknown>(),
      path: new Set<unknown>(),
      query: undefined as string | undefined,
      nodes: 0,
    };
    const text = describeChain(thrown, state, 0, "");
    const query = state.query === undefined ? "" : ` [query: ${state.query.slice(0, 300)}]`;
    return bound(text, LAST_ERROR_MAX - query.length) + query;
  } catch {
    return "something that cannot even be described"; // e.g. a Proxy that throws on every read
  }
}

interface DescribeState {
  /** Every error described so far, each once. */
  readonly seen: Set<unknown>;
  /** The errors wrapping the one being described: meeting one again is a cycle. */
  readonly path: Set<unknown>;
  query: string | undefined;
  nodes: number;
}

/** `thrown` and what it wraps. `outer` is the wrapper's message, to skip a cause it quotes. */
function describeChain(thrown: unknown, state: DescribeState, depth: number, outer: string): string {
  if (typeof thrown !== "object" || thrown === null) return describeNode(thrown, state, depth, outer);
  if (state.path.has(thrown)) return "(cycle)";
  if (state.seen.has(thrown)) return "(shown above)";
  state.seen.add(thrown);
  state.path.add(thrown);
  try {
    return describeNode(thrown, state, depth, outer);
  } finally {
    state.path.delete(thrown);
  }
}

function describeNode(thrown: unknown, state: DescribeState, depth: number, outer: string): string {
  state.nodes += 1;
  let node = thrown;
  if (isWrappedQueryError(node)) {
    state.query ??= String(read(node, "query"));
    node = read(node, "cause");
    if (typeof node === "object" && node !== null) state.seen.add(node);
  }
  const { head, message } = describeOne(node, outer);
  if (depth >= CHAIN_DEPTH || state.nodes >= CHAIN_NODES) return head;
  let text = head;
  const members = membersOf(node);
  if (members && members.length > 0) {
    const shown = members.slice(0, 10).map((m, i) => `(${i + 1}) ${describeChain(m, state, depth + 1, "")}`);
    const more = members.length > shown.length ? `; … ${members.length - shown.length} more` : "";
    text += ` [${members.length} error${members.length === 1 ? "" : "s"}: ${shown.join("; ")}${more}]`;
  }
  const cause = read(node, "cause");
  if (cause !== undefined && cause !== null) {
    text += ` ← caused by ${describeChain(cause, state, depth + 1, message)}`;
  }
  return text;
}

/** Longest message kept of one error in a chain, so that its causes still show. */
const NODE_MESSAGE_MAX = 2_000;

/** One error without what it wraps: `Name: message (code X)`. */
function describeOne(thrown: unknown, outer: string): { head: string; message: string } {
  if (typeof thrown === "string") return { head: thrown.slice(0, NODE_MESSAGE_MAX), message: thrown };
  if (isError(thrown)) {
    const name = String(read(thrown, "name") ?? "Error");
    const raw = read(thrown, "message");
    const message = typeof raw === "string" ? raw : String(raw ?? "");
    const code = read(thrown, "code");
    const codeText =
      typeof code === "string" && /^[A-Z][A-Z0-9_]{1,63}$/.test(code) && !isSoftcrumError(thrown)
        ? ` (code ${code})`
        : "";
    // A wrapper that quotes its cause's message (`sync failed: connect ECONNREFUSED …`) said it already.
    const quoted = message.length >= 8 && outer.includes(message);
    const head =
      quoted || message === "" ? `${name}${codeText}` : `${name}: ${message.slice(0, NODE_MESSAGE_MAX)}${codeText}`;
    return { head, message };
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(thrown);
  } catch {}
  if (json === undefined) {
    try {
      json = String(thrown);
    } catch {
      json = Object.prototype.toString.call(thrown);
    }
  }
  return { head: `non-error thrown: ${json.slice(0, NODE_MESSAGE_MAX)}`, message: "" };
}

function isError(thrown: unknown): boolean {
  try {
    return thrown instanceof Error;
  } catch {
    return false;
  }
}

/** At most `max` characters, saying so when cut. */
function bound(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, Math.max(0, max - 12))} …(cut)`;
}

function isWrappedQueryError(thrown: unknown): boolean {
  if (!isError(thrown)) return false;
  try {
    return (
      typeof read(thrown, "query") === "string" && "params" in (thrown as object) && read(thrown, "cause") !== undefined
    );
  } catch {
    return false;
  }
}
