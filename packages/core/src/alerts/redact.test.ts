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

describe("errorFingerprint folds every kind of id (#9 item 9)", () => {
  // Each failure names a different id of the same kind each time it happens.
  const ids: [string, string[]][] = [
    ["Mongo ObjectId", ["507f1f77bcf86cd799439011", "65a1b2c3d4e5f60718293a4b", "65A1B2C3D4E5F60718293A4C"]],
    ["ULID", ["01ARZ3NDEKTSV4RRFFQ69G5FAV", "01hqzx8k2m4n6p8r0t2v4w6y8z", "01HQZX9AAAAAAAAAAAAAAAAAAA"]],
    ["UUID", ["0b8f5e0a-1c2d-4e3f-8a9b-0c1d2e3f4a5b", "9F8E7D6C-5B4A-4F3E-9D2C-1B0A9F8E7D6C"]],
    ["charge id", ["ch_3MmlLrLkdIwHu7ix0snN0B15", "ch_1Nq2ab", "ch_9Zz"]],
    ["customer id", ["cus_NffrFeUfNV2Hib", "cus_Mx9bq3", "cus_4QFOF3xrvBT2nU"]],
    [
      "payment intent id",
      ["pi_3MtwBwLkdIwHu7ix28a3tqPa", "pi_1Ab", "pi_3MtwBwLkdIwHu7ix28a3tqPa_secret_YrKJUKribcBjcG8HVhfZluoGH"],
    ],
    ["event id", ["evt_1NG8Du2eZvKYlo2CUI79vXWy", "evt_3Ab7xYz9Qw"]],
    ["secret key", ["sk_live_51HxYz", "sk_test_4eC39HqLyjWDarjtT1zdp7dc"]],
    ["long number", ["12345678901234", "9", "4242 4242 4242 4242"]],
    ["request id", ["3f9a2c1e", "7bd04e22a1"]],
    ["nanoid", ["V1StGXR8_Z5jdHi6B-myT", "x7Kq2mP9aZ", "Ab3dEf7hIj"]],
  ];

  test.each(ids)("the same failure naming another %s has one fingerprint (#9 item 9)", (_kind, values) => {
    const prints = new Set(values.map((id) => errorFingerprint(`StripeError: No such object: ${id}; request failed`)));
    expect(prints.size).toBe(1);
    // Whatever kind of id it names: the failure is the same.
    expect(errorFingerprint(`StripeError: No such object: ${values[0]}; request failed`)).toBe(
      errorFingerprint("StripeError: No such object: 42; request failed"),
    );
  });

  test("different failures naming ids keep different fingerprints (#9 item 9)", () => {
    const failures = [
      "StripeError: No such customer: cus_NffrFeUfNV2Hib",
      "StripeError: No such charge: ch_3MmlLrLkdIwHu7ix0snN0B15",
      "StripeError: Your card was declined. (charge ch_3MmlLrLkdIwHu7ix0snN0B15)",
      "StripeError: Your card has insufficient funds. (charge ch_3MmlLrLkdIwHu7ix0snN0B15)",
      "MongoServerError: document 507f1f77bcf86cd799439011 failed validation",
      "MongoServerError: E11000 duplicate key error collection: shop.orders index: _id_ dup key: 507f1f77bcf86cd799439011",
      "Error: job 01ARZ3NDEKTSV4RRFFQ69G5FAV timed out",
      "Error: job 01ARZ3NDEKTSV4RRFFQ69G5FAV was cancelled",
      'PostgresError: relation "order_items" does not exist',
      'PostgresError: relation "user_profiles" does not exist',
      "Error: column in_progress is missing",
      "Error: column in_review is missing",
    ];
    expect(new Set(failures.map(errorFingerprint)).size).toBe(failures.length);
  });

  test("ULIDs and short provider ids are masked in alerts too (#9 item 9)", () => {
    expect(redactErrorMessage("Error: job 01hqzx8k2m4n6p8r0t2v4w6y8z for cus_Mx9bq3 failed")).toBe(
      "Error: job <id> for <id> failed",
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
