import { describe, expect, test } from "vitest";
import { alertErrorFields, errorFingerprint, postgresErrorFacts, redactErrorMessage } from "./redact.ts";

// Messages as Postgres 15 and postgres.js word them (checked against the server), as
// describeError prints them (`Name: message [query: …]`), and as handlers wrap them.
const cases: [string, string][] = [
  [
    'PostgresError: invalid input syntax for type integer: "jane@example.com" [query: select $1::int]',
    'PostgresError: invalid input syntax for type integer: "<redacted>" [query: select $1::int]',
  ],
  [
    'PostgresError: invalid input syntax for type integer: "a"b"',
    'PostgresError: invalid input syntax for type integer: "<redacted>"',
  ],
  [
    'PostgresError: value "99999999999" is out of range for type integer',
    'PostgresError: value "<redacted>" is out of range for type integer',
  ],
  [
    'PostgresError: date/time field value out of range: "1984-13-45"',
    'PostgresError: date/time field value out of range: "<redacted>"',
  ],
  [
    'PostgresError: invalid input value for enum mood: "furious"',
    'PostgresError: invalid input value for enum mood: "<redacted>"',
  ],
  ['PostgresError: Token "s3cr3t" is invalid.', 'PostgresError: Token "<redacted>" is invalid.'],
  [
    'PostgresError: duplicate key value violates unique constraint "users_email_key"',
    'PostgresError: duplicate key value violates unique constraint "users_email_key"',
  ],
  [
    "Error: register failed: Key (email)=(jane.doe@example.com) already exists.",
    "Error: register failed: Key (email)=(<redacted>) already exists.",
  ],
  ["Key (lower(email::text))=(Jane (x) Doe) already exists.", "Key (lower(email::text))=(<redacted>) already exists."],
  [
    'Key (tenant_id, customer_id)=(acme, 42) is not present in table "customers".',
    'Key (tenant_id, customer_id)=(<redacted>) is not present in table "customers".',
  ],
  [
    'PostgresError: null value in column "n" of relation "u" violates not-null constraint. Failing row contains (2, jane, null).',
    'PostgresError: null value in column "n" of relation "u" violates not-null constraint. Failing row contains (<redacted>)',
  ],
  [
    "PostgresError: relation \"orders\" does not exist [query: select * from \"orders\" where email = 'x@y.com' and note = 'it''s']",
    "PostgresError: relation \"orders\" does not exist [query: select * from \"orders\" where email = '<redacted>' and note = '<redacted>']",
  ],
  ["Error: customer 'jane' can't be found", "Error: customer '<redacted>' can't be found"],
  ['Error: unknown field "janedoe" of "acme"', 'Error: unknown field "<redacted>" of "<redacted>"'],
  ['Error: value "cut short by the dead let', 'Error: value "<redacted>'],
  ["Error: customer jane.doe+x@mail.example.co.uk not found", "Error: customer <email> not found"],
  ["Error: job 01a20000-0000-7000-8000-000000000001 failed", "Error: job <uuid> failed"],
  [
    "StripeError: No such customer: cus_NffrFeUfNV2Hib (payment pi_3MtwBwLkdIwHu7ix28a3tqPa)",
    "StripeError: No such customer: <id> (payment <id>)",
  ],
  [
    "Error: bad key sk_live_51H8aBcDeFgHiJkLmNoPqRsT, jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln, AKIAIOSFODNN7EXAMPLE1234, deadbeefdeadbeefcafe",
    "Error: bad key <id>, jwt <token>, <token>, <token>",
  ],
  [
    "Error: call +33 6 12 34 56 78 or card 4242 4242 4242 4242; took 3000 ms, attempt 3 of 5",
    "Error: call <number> or card <number>; took 3000 ms, attempt 3 of 5",
  ],
  [
    "Error: connect ECONNREFUSED in processed_jobs_expiry_idx order_processing (SQLSTATE 57P01)",
    "Error: connect ECONNREFUSED in processed_jobs_expiry_idx order_processing (SQLSTATE 57P01)",
  ],
];

describe("redactErrorMessage (#8 item 14)", () => {
  test.each(cases)("masks the values of %j and keeps what names the failure (#8 item 14)", (message, redacted) => {
    expect(redactErrorMessage(message)).toBe(redacted);
  });

  test("redacting twice changes nothing, and the fingerprint of a message is that of its redaction (#8 item 14)", () => {
    for (const [message] of cases) {
      const once = redactErrorMessage(message);
      expect(redactErrorMessage(once)).toBe(once);
      expect(errorFingerprint(once)).toBe(errorFingerprint(message));
    }
  });

  test("identifiers named by the error are kept wherever they are quoted (#8 item 14)", () => {
    expect(redactErrorMessage('insert failed on "users_email_key": "jane"', ["users_email_key"])).toBe(
      'insert failed on "users_email_key": "<redacted>"',
    );
  });

  test("one failure mode, one fingerprint; another mode, another fingerprint (#8 item 14)", () => {
    const invalid = (v: string) => `PostgresError: invalid input syntax for type integer: "${v}"`;
    expect(errorFingerprint(invalid("abc"))).toBe(errorFingerprint(invalid("jane@example.com")));
    const duplicate = (email: string) => `Error: Key (email)=(${email}) already exists.`;
    expect(errorFingerprint(duplicate("a@b.com"))).toBe(errorFingerprint(duplicate("c.d@e.org")));
    expect(errorFingerprint('duplicate key value violates unique constraint "users_email_key"')).not.toBe(
      errorFingerprint('duplicate key value violates unique constraint "users_phone_key"'),
    );
  });
});

describe("postgresErrorFacts / alertErrorFields (#8 item 14)", () => {
  const pgError = Object.assign(new Error('duplicate key value violates unique constraint "users_email_key"'), {
    name: "PostgresError",
    severity: "ERROR",
    code: "23505",
    detail: "Key (email)=(jane@example.com) already exists.",
    constraint_name: "users_email_key",
    table_name: "users",
    schema_name: "public",
  });

  test("reads SQLSTATE and names through Drizzle's wrapper and handler causes, in both drivers' spellings (#8 item 14)", () => {
    const wrapped = Object.assign(new Error("Failed query: insert …"), {
      query: "insert …",
      params: [],
      cause: pgError,
    });
    expect(postgresErrorFacts(new Error("import failed", { cause: wrapped }))).toEqual({
      sqlState: "23505",
      constraint: "users_email_key",
      table: "users",
      schema: "public",
    });
    const nodePg = Object.assign(new Error("x"), { severity: "ERROR", code: "23502", column: "email", table: "users" });
    expect(postgresErrorFacts(nodePg)).toEqual({ sqlState: "23502", column: "email", table: "users" });
  });

  test("a Node error code is not a SQLSTATE (#8 item 14)", () => {
    expect(postgresErrorFacts(Object.assign(new Error("write EPIPE"), { code: "EPIPE" }))).toEqual({});
  });

  test("the alert's error is redacted and bounded; facts it does not have are left out (#8 item 14)", () => {
    expect(alertErrorFields(`PermanentError: ${pgError.message} ${pgError.detail}`, pgError)).toEqual({
      error:
        'PermanentError: duplicate key value violates unique constraint "users_email_key" Key (email)=(<redacted>) already exists.',
      sqlState: "23505",
      constraint: "users_email_key",
      table: "users",
    });
    const long = alertErrorFields(`Error: ${"x".repeat(600)} "secret"`);
    expect(long.error.length).toBeLessThanOrEqual(500);
    expect(Object.keys(long)).toEqual(["error"]);
    // A quoted value the clip cuts open is masked to the end.
    expect(alertErrorFields(`Error: value "${"x".repeat(5000)}"`).error).toBe('Error: value "<redacted>');
  });
});
