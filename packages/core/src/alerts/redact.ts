/**
 * What of an error may leave the database in an alert (SPEC §4 "Alerts").
 *
 * Postgres quotes the offending input in many messages (22P02
 * `invalid input syntax for type integer: "abc"`, 22003, 22007, a 23505
 * detail `Key (email)=(jane@example.com) already exists`), and handlers wrap
 * such text into their own errors. The dead-letter row keeps that full text
 * as evidence; an alert carries the error redacted: values masked, while
 * what names the failure mode stays (error class names, SQLSTATE codes,
 * constraint, column and table names, the query's SQL).
 */
import { createHash } from "node:crypto";

/** Longest redacted error an alert carries, in characters. */
export const ALERT_ERROR_MAX = 500;

const REDACTED = "<redacted>";

/**
 * A double-quoted name right after one of these words is an identifier
 * Postgres printed (`unique constraint "users_email_key"`, `column "email" of
 * relation "users"`), not a value: it stays. Only Postgres' object words: a
 * generic word ("field", "of") before a quoted value would keep the value.
 */
const IDENTIFIER_BEFORE =
  /(?:^|[^A-Za-z_])(?:constraint|relation|column|table|index|schema|sequence|view|type|function|procedure|database|role|trigger|domain|extension|operator|collation|publication|subscription|tablespace|savepoint|cursor|portal|statement|server|policy|rule|parameter|channel)\s*$/i;
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_$.]{0,126}$/;

/**
 * Masks the values an error message may quote, keeping what names the
 * failure mode. `keep` are identifiers known from the error itself
 * (constraint, column, table names), kept wherever they are quoted.
 * Idempotent: redacting a redacted message changes nothing.
 *
 * Masked: quoted values (double, single, back quotes), `Key (…)=(…)` and
 * `Failing row contains (…)` values, e-mail addresses, UUIDs, ULIDs, JWTs, provider
 * ids (`cus_…`, `pi_…`, `sk_live_…`), hex runs, long tokens (base64, API
 * keys), runs of 7+ digits (phone, card, account numbers). In a trailing
 * `[query: …]` (see `describeError`), SQL string literals are masked and
 * double-quoted identifiers kept.
 */
export function redactErrorMessage(message: string, keep: readonly string[] = []): string {
  const queryAt = message.lastIndexOf(" [query: ");
  if (queryAt >= 0) {
    return redactText(message.slice(0, queryAt), keep) + redactSql(message.slice(queryAt));
  }
  return redactText(message, keep);
}

function redactText(text: string, keep: readonly string[]): string {
  const known = new Set(keep.filter((k) => k !== ""));
  let out = text
    // 23505 / 23503 details: `Key (email)=(jane@example.com) already exists.`
    // The values may hold parentheses: they end at the phrase after them, else at the line's last `)`.
    .replace(/(\bKey \((?:[^()\n]|\([^()\n]*\))*\)=\()(.*)$/gm, (_m, head: string, rest: string) => {
      const phrase = /\)(?=\s+(?:already exists|is not present|is still referenced|conflicts with))/.exec(rest);
      const end = phrase ? phrase.index : rest.lastIndexOf(")");
      return end === -1 ? `${head}${REDACTED}` : `${head}${REDACTED}${rest.slice(end)}`;
    })
    // 23502 / 23514 details: `Failing row contains (2, jane, null).`
    .replace(/(\bFailing row contains \().*$/gm, (_m, head: string) => `${head}${REDACTED})`)
    // `…: "value"` closing a line: Postgres does not escape quotes inside the
    // value (`"a"b"`), so everything up to the line's last quote is the value.
    .replace(/(:\s+)"(?:.*)"(?=[ \t]*$)/gm, (_m, head: string) => `${head}"${REDACTED}"`);
  out = maskQuoted(
    out,
    '"',
    (inner, before) => known.has(inner) || (IDENTIFIER.test(inner) && IDENTIFIER_BEFORE.test(before)),
  );
  out = maskQuoted(out, "'", (inner) => known.has(inner));
  out = maskQuoted(out, "`", (inner) => known.has(inner));
  out = maskUnquoted(out);
  return out;
}

const WORD = /[A-Za-z0-9_]/;

/**
 * Masks what stands between `quote`s, unless `keep(inner, textBefore)`. A quote
 * opens only after a non-word character and closes only before one (the
 * apostrophe of "can't" opens nothing); a quote left open (a message cut
 * short) hides the rest of its line.
 */
function maskQuoted(text: string, quote: string, keep: (inner: string, before: string) => boolean): string {
  let out = "";
  let i = 0;
  let lineEnd = -1;
  while (i < text.length) {
    const c = text[i] as string;
    if (c !== quote || (i > 0 && WORD.test(text[i - 1] as string))) {
      out += c;
      i += 1;
      continue;
    }
    if (lineEnd < i) {
      const newline = text.indexOf("\n", i);
      lineEnd = newline === -1 ? text.length : newline;
    }
    let close = -1;
    for (let j = i + 1; j < lineEnd; j++) {
      if (text[j] === quote && (j + 1 >= text.length || !WORD.test(text[j + 1] as string))) {
        close = j;
        break;
      }
    }
    if (close === -1) {
      out += `${quote}${REDACTED}`;
      i = lineEnd;
      continue;
    }
    const inner = text.slice(i + 1, close);
    out +=
      inner === REDACTED || keep(inner, text.slice(Math.max(0, i - 40), i))
        ? text.slice(i, close + 1)
        : `${quote}${REDACTED}${quote}`;
    i = close + 1;
  }
  return out;
}

function redactSql(query: string): string {
  const masked = query
    // String literals: '…' with '' escapes, E'…', dollar quotes.
    .replace(/\$([A-Za-z_]*)\$[\s\S]*?\$\1\$/g, `'${REDACTED}'`)
    .replace(/'(?:[^']|'')*('|$)/g, (match) => (match === `'${REDACTED}'` ? match : `'${REDACTED}'`));
  return maskUnquoted(masked);
}

/** Object id prefixes of payment and messaging providers (Stripe's, mostly): `ch_`, `cus_`, `pi_`, `evt_`, `sk_live_`. */
const KNOWN_PROVIDER_ID =
  /\b(?:acct|ba|card|ch|cn|cs|cus|dp|du|evt|file|ii|in|ipi|link|pi|pk|pm|po|price|prod|promo|py|pyr|re|rk|seti|si|sk|sub|tok|tr|txi|txn|whsec)_(?:(?:live|test)_)?(?=[A-Za-z0-9]*[A-Z0-9])[A-Za-z0-9]{3,}\b/g;

/** Values that need no quotes to be recognised. */
function maskUnquoted(text: string): string {
  return (
    text
      .replace(/(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}/g, "<email>")
      .replace(/\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b/g, "<uuid>")
      .replace(/\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*/g, "<token>")
      // Provider ids: a short lowercase prefix, `_`, then an opaque id (cus_NffrFeUfNV2Hib, sk_live_…, whsec_…);
      // a prefix known to name a provider object (Stripe's ch_, cus_, pi_, evt_, sk_…) whatever the id's length.
      .replace(/\b[a-z]{2,10}_(?:(?:live|test)_)?(?=[A-Za-z0-9]*[A-Z0-9])[A-Za-z0-9]{8,}\b/g, "<id>")
      .replace(KNOWN_PROVIDER_ID, "<id>")
      // ULIDs: 26 Crockford base32 characters, the first 0-7 (timestamp), in either case.
      .replace(/\b(?=[0-9]*[A-Za-z])[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}\b/g, "<id>")
      .replace(/\b(?:0x)?[0-9a-fA-F]{16,}\b/g, "<token>")
      // Long opaque runs (API keys, base64): letters and digits mixed, 20+ characters.
      .replace(
        /(?<![A-Za-z0-9+/_=-])(?=[A-Za-z0-9+/_=-]*[0-9])(?=[A-Za-z0-9+/_=-]*[A-Za-z])[A-Za-z0-9+/_=-]{20,}/g,
        (run) => (/^[a-z_]+$/.test(run.replace(/[0-9]/g, "")) && !/[0-9]{3,}/.test(run) ? run : "<token>"),
      )
      // Phone, card and account numbers: 7+ digits, separators allowed.
      .replace(/\+?(?<![A-Za-z0-9_$])\d[\d \-().]{5,}\d(?![A-Za-z0-9_])/g, (run) =>
        (run.match(/\d/g)?.length ?? 0) >= 7 ? "<number>" : run,
      )
  );
}

/** The Postgres facts of an error: safe to alert on, they name the failure mode, not the data. */
export interface PostgresErrorFacts {
  /** The SQLSTATE (`23505`). */
  readonly sqlState?: string;
  readonly constraint?: string;
  readonly column?: string;
  readonly table?: string;
  readonly schema?: string;
}

/**
 * Finds the Postgres error behind `thrown` (itself or along its `cause`
 * chain: Drizzle wraps it, handlers may too) and reads its SQLSTATE and
 * names. postgres.js calls them `constraint_name`…, node-postgres and PGlite
 * `constraint`…. Empty when no Postgres error is found.
 */
export function postgresErrorFacts(thrown: unknown): PostgresErrorFacts {
  // The facts are extras of an alert: a thrown value whose getters throw has none.
  try {
    return factsAlong(thrown);
  } catch {
    return {};
  }
}

function factsAlong(thrown: unknown): PostgresErrorFacts {
  let current: unknown = thrown;
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const e = current as Record<string, unknown>;
    const code = e["code"];
    // Node's own codes (EPIPE) look like a SQLSTATE too; a Postgres error also has a severity.
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && typeof e["severity"] === "string") {
      const name = (snake: string, short: string) => {
        const value = e[snake] ?? e[short];
        return typeof value === "string" && value !== "" ? value : undefined;
      };
      return withoutUndefined({
        sqlState: code,
        constraint: name("constraint_name", "constraint"),
        column: name("column_name", "column"),
        table: name("table_name", "table"),
        schema: name("schema_name", "schema"),
      });
    }
    current = e["cause"];
  }
  return {};
}

function withoutUndefined<T extends object>(value: T): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as {
    [K in keyof T]?: Exclude<T[K], undefined>;
  };
}

/** What an alert says about the error: the redacted message plus the Postgres facts it has. */
export interface AlertErrorFields {
  /** Redacted and cut to `ALERT_ERROR_MAX` characters. */
  readonly error: string;
  readonly sqlState?: string;
  readonly constraint?: string;
  readonly column?: string;
  readonly table?: string;
}

/**
 * The error fields of a dead-letter alert: `message` is the dead letter's
 * full error text, `thrown` what the handler threw (when there was a throw).
 * Facts the error does not have are left out.
 */
export function alertErrorFields(message: string, thrown?: unknown): AlertErrorFields {
  const { schema, ...facts } = postgresErrorFacts(thrown);
  const keep = [facts.constraint, facts.column, facts.table, schema].filter((n): n is string => n !== undefined);
  return { error: cut(redactErrorMessage(clip(message), keep), ALERT_ERROR_MAX), ...facts };
}

/**
 * The part of a long message worth redacting for an alert, which keeps only
 * `ALERT_ERROR_MAX` characters: it bounds the work. Whatever the clip cuts in
 * half lies past the alert's cut, or is a quoted or `Key (…)=(…)` value left
 * open, which the redaction masks to the end.
 */
export function clip(message: string): string {
  return message.slice(0, 4 * ALERT_ERROR_MAX);
}

/** Cuts without leaving half a mask (`<reda`), which a later redaction could not recognise. */
function cut(text: string, max: number): string {
  if (text.length <= max) return text;
  const head = text.slice(0, max);
  const open = head.lastIndexOf("<");
  return open > head.lastIndexOf(">") && open > max - REDACTED.length ? head.slice(0, open) : head;
}

/**
 * The coalescing fingerprint of an error message: the same failure with other
 * values has the same fingerprint ("order 123 not found" and "order 456 not
 * found"; `"abc"` and `"xyz"` as invalid integers; any two e-mail addresses
 * in a 23505 detail; Mongo ObjectIds, ULIDs, UUIDs, provider ids, long
 * numbers). It masks what `redactErrorMessage` masks, then what is shaped
 * like an id though it needs no redaction (hex runs of 8+, mixed-case
 * letters and digits of 10+), then every number; every mask counts as the
 * same value, so `cus_…` and `<token>` in the same place fold. It works on
 * the redaction, so `errorFingerprint(m) === errorFingerprint(redactErrorMessage(m))`.
 */
export function errorFingerprint(error: string): string {
  const shape = redactErrorMessage(error)
    .replace(/(["'`])<redacted>\1?/g, "<redacted>")
    // Request ids, short hashes: hex with both digits and letters.
    .replace(/\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b/g, "<v>")
    // Opaque ids (nanoid, base62): letters of both cases and digits, 10+.
    .replace(/\b(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[A-Z])[A-Za-z0-9]{10,}\b/g, "<v>")
    .toLowerCase()
    .replace(/<(?:redacted|email|uuid|token|id|number)>/g, "<v>")
    .replace(/\d+/g, "<v>")
    .replace(/\s+/g, " ")
    .trim();
  return createHash("sha256").update(shape).digest("hex").slice(0, 16);
}
