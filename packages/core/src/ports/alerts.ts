import type { DeadLetterErrorClass } from "../db/schema.ts";

/**
 * What an alert about a new dead letter says. Never the payload, nor values
 * quoted in the error: they may hold personal data (SPEC §4 "Alerts").
 */
export interface DeadLetterAlert {
  readonly deadLetterId: string;
  readonly jobId: string | null;
  readonly queue: string;
  readonly consumer: string;
  readonly tenantId: string | null;
  readonly kind: string | null;
  readonly correlationId: string | null;
  readonly errorClass: DeadLetterErrorClass;
  readonly attempts: number;
  /**
   * The error, redacted (`redactErrorMessage`: values quoted in it, e-mail
   * addresses, tokens and provider ids masked) and cut short. The dead-letter
   * row keeps the full text.
   */
  readonly error: string;
  /** The SQLSTATE of the Postgres error behind the failure (`23505`), when there was one. */
  readonly sqlState?: string | null;
  /** The constraint, column and table the Postgres error named, when it named them. */
  readonly constraint?: string | null;
  readonly column?: string | null;
  readonly table?: string | null;
}

/**
 * Where alerts about new dead letters go (BetterStack in production). The
 * harness calls it after the dead-letter row is committed and does not wait
 * for it: a slow or failing sink never blocks or loses the row.
 */
export interface AlertPort {
  deadLetterCreated(alert: DeadLetterAlert): Promise<void> | void;
  /**
   * Resolves once every alert of the dead letters reported so far has been
   * delivered, or recorded durably where a later alert or flush reports it
   * (BetterStack: the count of a coalescing window in `core.alert_windows`).
   * A process that may end at any moment awaits it before it lets go: the
   * Vercel push route before its response returns, `receiveAvailable` before
   * it resolves (through `BoundConsumer.flushAlerts`). Optional: a sink that
   * delivers in `deadLetterCreated` needs none.
   */
  flush?(): Promise<void>;
}

export const noopAlerts: AlertPort = { deadLetterCreated() {} };
