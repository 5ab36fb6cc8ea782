import fc from "fast-check";
import { uuidv4, uuidv7 } from "uuidv7";
import { describe, expect, test } from "vitest";
import {
  checkEnvelope,
  createEnvelope,
  ENVELOPE_FIELD_MAX,
  envelopeSchema,
  jobCreatedAt,
  parseEnvelope,
} from "./envelope.ts";
import { InvalidEnvelopeError, isSoftcrumError } from "./errors.ts";

const valid = () => ({
  job_id: uuidv7(),
  tenant_id: "t-1",
  correlation_id: "req-1",
  kind: "points.award.v1",
  data: { points: 1 },
});

describe("createEnvelope", () => {
  test("creates a valid envelope with a fresh UUID v7 job_id that also starts the correlation chain", () => {
    const a = createEnvelope({ tenantId: "t-1", kind: "points.award.v1", data: { points: 5 } });
    const b = createEnvelope({ tenantId: "t-1", kind: "points.award.v1", data: { points: 5 } });
    expect(a.job_id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(a.job_id).not.toBe(b.job_id);
    expect(a.correlation_id).toBe(a.job_id);
    expect(a).toEqual({
      job_id: a.job_id,
      tenant_id: "t-1",
      correlation_id: a.job_id,
      kind: "points.award.v1",
      data: { points: 5 },
    });
  });

  test("keeps a given correlation id and a caller-chosen v7 job id", () => {
    const jobId = uuidv7();
    const e = createEnvelope({ tenantId: "t", kind: "k.v1", data: null, correlationId: "req-9", jobId });
    expect(e.job_id).toBe(jobId);
    expect(e.correlation_id).toBe("req-9");
  });

  test("refuses bad input with a typed error that lists every problem", () => {
    let thrown: unknown;
    try {
      createEnvelope({ tenantId: "", kind: "has space", data: 1, jobId: uuidv4() });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(InvalidEnvelopeError);
    expect(isSoftcrumError(thrown, "INVALID_ENVELOPE")).toBe(true);
    const issues = (thrown as InvalidEnvelopeError).issues;
    expect(issues).toEqual(
      expect.arrayContaining([
        "job_id: must be a UUID version 7",
        "tenant_id: must be a non-empty string",
        expect.stringMatching(/^kind: must be letters, digits/),
      ]),
    );
  });
});

describe("parseEnvelope", () => {
  test.each([
    ["a UUID v4 job_id", { job_id: uuidv4() }, "job_id: must be a UUID version 7"],
    ["a job_id that is no UUID", { job_id: "42" }, "job_id: must be a UUID version 7"],
    ["an empty correlation_id", { correlation_id: "" }, "correlation_id: must be a non-empty string"],
    ["an over-long tenant_id", { tenant_id: "x".repeat(ENVELOPE_FIELD_MAX + 1) }, "tenant_id:"],
    ["a missing data field", { data: undefined }, "data: is required"],
    ["a numeric kind", { kind: 7 }, "kind:"],
  ])("rejects %s", (_name, patch, message) => {
    const check = checkEnvelope({ ...valid(), ...patch });
    expect(check.ok).toBe(false);
    expect(check.ok ? [] : check.issues.join("\n")).toContain(message);
  });

  test.each([null, 42, "text", []])("rejects a non-object (%j)", (value) => {
    expect(() => parseEnvelope(value)).toThrow(InvalidEnvelopeError);
  });

  test("accepts null data and strips unknown top-level keys (a later envelope field does not poison old consumers)", () => {
    const parsed = parseEnvelope({ ...valid(), data: null, future_field: 1 });
    expect(parsed.data).toBeNull();
    expect(parsed).not.toHaveProperty("future_field");
  });
});

test("an upper-case job_id is accepted and read in lower case, as the fence stores it", () => {
  const id = uuidv7();
  expect(parseEnvelope({ ...valid(), job_id: id.toUpperCase() }).job_id).toBe(id);
});

test("jobCreatedAt reads the creation time out of a UUID v7", () => {
  const before = Date.now();
  const id = uuidv7();
  expect(jobCreatedAt(id)).toBeGreaterThanOrEqual(before);
  expect(jobCreatedAt(id)).toBeLessThanOrEqual(Date.now());
});

test("checkEnvelope gives the schema's answer for any input: the same envelope (keys, order, values) or a refusal (its plain-code check of the well-formed case never accepts what the schema refuses, nor changes what it returns)", () => {
  const hex = fc.constantFrom(..."0123456789abcdefABCDEFg-");
  const jobId = fc.oneof(
    fc.constant(null).map(() => uuidv7()),
    fc.constant(null).map(() => uuidv7().toUpperCase()),
    fc.constant(null).map(() => uuidv4()),
    fc.string({ unit: hex, minLength: 30, maxLength: 40 }),
    fc.constant(null).map(() => `${uuidv7()}\n`),
    fc.constant(null).map(() => ` ${uuidv7()}`),
    fc.integer(),
  );
  const text = fc.oneof(
    fc.string({ minLength: 0, maxLength: 3 }),
    fc.string({ unit: fc.constantFrom("a", "Z", "0", ".", "_", ":", "-", " ", "é", "\n"), maxLength: 12 }),
    fc.nat({ max: 3 }).map((extra) => "k".repeat(ENVELOPE_FIELD_MAX - 1 + extra)),
    fc.constantFrom("points.award.v1", "-starts-with-dash", "a", ""),
    fc.constantFrom(undefined, null, 5, true, ["a"], { a: 1 }),
  );
  const data = fc.oneof(fc.constant(undefined), fc.jsonValue());
  const envelope = fc.record(
    {
      job_id: jobId,
      tenant_id: text,
      correlation_id: text,
      kind: text,
      data,
      extra: fc.jsonValue(),
    },
    { requiredKeys: [] },
  );
  const input = fc.oneof(
    { weight: 8, arbitrary: envelope },
    { weight: 1, arbitrary: fc.constantFrom(null, 7, "text", [], [1], Object.create(null)) },
  );
  fc.assert(
    fc.property(input, (value) => {
      const schema = envelopeSchema.safeParse(value);
      const check = checkEnvelope(value);
      expect(check.ok).toBe(schema.success);
      if (check.ok && schema.success) {
        expect(Object.keys(check.envelope)).toEqual(Object.keys(schema.data));
        expect(check.envelope).toStrictEqual(schema.data);
      }
    }),
    { numRuns: 3_000 },
  );
});
