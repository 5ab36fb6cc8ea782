import { z } from "zod";
import { DEAD_LETTER_STATUSES, ERROR_CLASSES } from "../db/schema.ts";
import { formatIssues } from "../envelope.ts";
import { OpsError } from "../errors.ts";

/**
 * Postgres refuses a NUL byte in text (`invalid byte sequence`), so text with
 * one is refused here, before any query, as bad input rather than a failure.
 */
const noNul = (schema: z.ZodString) =>
  schema.refine((value) => !value.includes("\u0000"), { error: "must not contain a NUL byte (\\0)" });

const text = noNul(z.string().trim().min(1).max(200));
/**
 * A point in time: a Date, or an ISO 8601 date-time WITH its offset. Without
 * one ("2026-11-29T08:00") the meaning would depend on the machine's time zone.
 */
const instant = z
  .union([z.date(), z.iso.datetime({ offset: true }).transform((text) => new Date(text))], {
    error: "must be a date/time (ISO 8601 with an offset, e.g. 2026-11-29T08:00:00Z)",
  })
  // Years the database's timestamps take as sent (a year 0, or 10000 after
  // the offset, is a database error, which the HTTP API answered with a 500).
  .refine((at) => at.getUTCFullYear() >= 1 && at.getUTCFullYear() <= 9999, {
    error: "must be a date/time between the years 1 and 9999 (UTC)",
  });

/** Which dead letters an operation looks at. Every field narrows; none means all. */
export const deadLetterFilterSchema = z
  .strictObject({
    queue: text.optional(),
    consumer: text.optional(),
    tenantId: text.optional(),
    kind: text.optional(),
    errorClass: z.enum(ERROR_CLASSES).optional(),
    status: z.enum(DEAD_LETTER_STATUSES).optional(),
    createdAfter: instant.optional(),
    createdBefore: instant.optional(),
  })
  .refine((f) => !(f.createdAfter && f.createdBefore) || f.createdAfter < f.createdBefore, {
    message: "createdAfter must be before createdBefore",
  });
export type DeadLetterFilter = z.input<typeof deadLetterFilterSchema>;
export type ParsedFilter = z.output<typeof deadLetterFilterSchema>;

/** Validates operator input with a schema; a failure is an `OpsError("INVALID_INPUT")` naming every problem. */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  // An absent input is first tried as absent (an optional value, e.g. no
  // status filter), then as an empty object (an input whose fields all default).
  let result = schema.safeParse(value);
  if (!result.success && value == null) result = schema.safeParse({});
  if (!result.success) {
    throw new OpsError(
      "INVALID_INPUT",
      `invalid ${what}: ${formatIssues(result.error).join("; ").replaceAll("envelope:", "")}`,
    );
  }
  return result.data;
}

export const operatorSchema = noNul(z.string().trim().min(1, "operator is required").max(200));
/**
 * A reason that is not blank by JavaScript's `trim()` (tabs, line breaks and
 * Unicode spaces are blank). The database refuses the same blanks for a
 * discard (migration 0009, `NOT_BLANK_PATTERN` in db/schema.ts).
 */
export const reasonSchema = noNul(z.string().trim().min(1, "a non-empty reason is required").max(2000));
export const idListSchema = z
  .array(z.uuid({ error: "must be a dead-letter id (UUID)" }))
  .min(1, "give at least one id")
  .max(1000);
