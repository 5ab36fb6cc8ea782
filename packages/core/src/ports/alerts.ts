import type { DeadLetterErrorClass } from "../db/schema.ts";

/** What an alert about a new dead letter says. Never the payload: it may hold personal data. */
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
  /** The error, cut short. */
  readonly error: string;
}

/**
 * Where alerts about new dead letters go (BetterStack in production). The
 * harness calls it after the dead-letter row is committed and does not wait
 * for it: a slow or failing sink never blocks or loses the row.
 */
export interface AlertPort {
  deadLetterCreated(alert: DeadLetterAlert): Promise<void> | void;
}

export const noopAlerts: AlertPort = { deadLetterCreated() {} };
