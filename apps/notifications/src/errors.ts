/**
 * The notifications module's own errors, for the callers of `startBlast`.
 * Each has a string `code` and is recognised by it (`isNotificationsError`),
 * not only by `instanceof`: a module loaded twice breaks `instanceof`.
 * Failures inside a consumer use the core's `PermanentError` /
 * `RateLimitedError`, which the harness knows.
 */

export type NotificationsErrorCode =
  | "INVALID_BLAST"
  | "EMPTY_BLAST"
  | "BLAST_CONFLICT"
  | "INVALID_EMAIL"
  | "INVALID_CONTACT";

const BRAND = "@softcrum/example-notifications:error";

export class NotificationsError extends Error {
  readonly [BRAND] = true;
  readonly code: NotificationsErrorCode;

  constructor(code: NotificationsErrorCode, message: string) {
    super(message);
    this.code = code;
    this.name = new.target.name;
  }
}

export function isNotificationsError(error: unknown, code?: NotificationsErrorCode): error is NotificationsError {
  if (typeof error !== "object" || error === null) return false;
  const tagged = (error as Record<string, unknown>)[BRAND] === true;
  return tagged && (code === undefined || (error as { code?: unknown }).code === code);
}

/** The blast's input is not one we can send: `issues` lists every problem. Nothing was written. */
export class InvalidBlastError extends NotificationsError {
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super("INVALID_BLAST", `invalid blast: ${issues.join("; ")}`);
    this.issues = issues;
  }
}

/** The tenant has no subscribed contact: a blast to nobody is refused, and nothing was written. */
export class EmptyBlastError extends NotificationsError {
  constructor(
    readonly tenantId: string,
    readonly blastId: string,
  ) {
    super("EMPTY_BLAST", `blast ${blastId}: tenant ${JSON.stringify(tenantId)} has no subscribed contact to send to`);
  }
}

/**
 * The blast id is already a blast with another tenant or message: starting
 * it again may only publish the same jobs, never send something else under
 * the same id.
 */
export class BlastConflictError extends NotificationsError {
  constructor(
    readonly blastId: string,
    what: string,
  ) {
    super("BLAST_CONFLICT", `blast ${blastId} was started with a different ${what}; use a new blast id`);
  }
}

/** A transactional e-mail that cannot be sent as given: `issues` lists every problem. Nothing was published. */
export class InvalidEmailError extends NotificationsError {
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super("INVALID_EMAIL", `invalid e-mail: ${issues.join("; ")}`);
    this.issues = issues;
  }
}

/** Contacts that cannot be stored as given: `issues` lists every problem. Nothing was written. */
export class InvalidContactError extends NotificationsError {
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super("INVALID_CONTACT", `invalid contacts: ${issues.join("; ")}`);
    this.issues = issues;
  }
}

/** `path: message` for each Zod issue. */
export function issuesOf(error: {
  readonly issues: readonly { path: readonly PropertyKey[]; message: string }[];
}): string[] {
  return error.issues.map((i) => `${i.path.length > 0 ? i.path.map(String).join(".") : "input"}: ${i.message}`);
}
