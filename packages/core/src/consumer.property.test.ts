/**
 * Issue 12 item 2: property tests of the harness's poison check, on real
 * Postgres with real Zod schemas. Random bytes, random JSON, and random
 * envelopes carrying random data against random schemas: every delivery ends
 * as processed (one fence, one effect) or as exactly one poison letter,
 * `deliver()` never rejects, an acknowledged delivery always left its row,
 * and a letter's payload decodes back to the bytes received.
 *
 * Each case gets a consumer of its own, so the rows it left are told apart by
 * the consumer column (two cases may well send the same bytes). The run is
 * bounded (a few hundred cases in all); FC_SEED replays a failing run.
 */
import { createHash } from "node:crypto";
import { and, eq } from "drizzle-orm";
import fc from "fast-check";
import { describe, expect, test } from "vitest";
import { z } from "zod";
import { effects, silentLogger, useEffectsDatabase } from "../test/fixtures.ts";
import { bindConsumer, defineConsumer } from "./consumer.ts";
import { deadLetters, processedJobs } from "./db/schema.ts";
import { checkEnvelope } from "./envelope.ts";
import type { DeliveryResult } from "./queue-port.ts";

const pg = useEffectsDatabase("consumer_property");

const KIND = "prop.thing.v1";
const seed = process.env["FC_SEED"] === undefined ? undefined : Number(process.env["FC_SEED"]);
const runs = (numRuns: number) => ({ numRuns, ...(seed === undefined ? {} : { seed }), endOnFailure: true });

/** A random Zod schema, described as data so fast-check can print and shrink it. */
type SchemaSpec =
  | { t: "string"; min?: number }
  | { t: "number"; int?: boolean }
  | { t: "boolean" }
  | { t: "null" }
  | { t: "literal"; value: string | number | boolean }
  | { t: "enum"; values: string[] }
  | { t: "array"; of: SchemaSpec; max?: number }
  | { t: "object"; fields: [string, SchemaSpec][]; strict?: boolean }
  | { t: "record"; of: SchemaSpec }
  | { t: "optional"; of: SchemaSpec }
  | { t: "nullable"; of: SchemaSpec }
  | { t: "union"; of: [SchemaSpec, SchemaSpec] };

const schemaSpec: fc.Arbitrary<SchemaSpec> = fc.letrec<{ spec: SchemaSpec }>((tie) => ({
  spec: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    fc.record({ t: fc.constant("string" as const), min: fc.option(fc.nat(3), { nil: undefined }) }),
    fc.record({ t: fc.constant("number" as const), int: fc.option(fc.boolean(), { nil: undefined }) }),
    fc.constant({ t: "boolean" as const }),
    fc.constant({ t: "null" as const }),
    fc.record({ t: fc.constant("literal" as const), value: fc.oneof(fc.string(), fc.integer(), fc.boolean()) }),
    fc.record({
      t: fc.constant("enum" as const),
      values: fc.uniqueArray(fc.string({ minLength: 1, maxLength: 5 }), { minLength: 1, maxLength: 4 }),
    }),
    fc.record({ t: fc.constant("array" as const), of: tie("spec"), max: fc.option(fc.nat(4), { nil: undefined }) }),
    fc.record({
      t: fc.constant("object" as const),
      fields: fc.uniqueArray(fc.tuple(fc.string({ minLength: 1, maxLength: 6 }), tie("spec")), {
        maxLength: 4,
        selector: ([key]) => key,
      }),
      strict: fc.option(fc.boolean(), { nil: undefined }),
    }),
    fc.record({ t: fc.constant("record" as const), of: tie("spec") }),
    fc.record({ t: fc.constant("optional" as const), of: tie("spec") }),
    fc.record({ t: fc.constant("nullable" as const), of: tie("spec") }),
    fc.record({ t: fc.constant("union" as const), of: fc.tuple(tie("spec"), tie("spec")) }),
  ),
})).spec;

function toZod(spec: SchemaSpec): z.ZodType {
  switch (spec.t) {
    case "string":
      return spec.min === undefined ? z.string() : z.string().min(spec.min);
    case "number":
      return spec.int ? z.number().int() : z.number();
    case "boolean":
      return z.boolean();
    case "null":
      return z.null();
    case "literal":
      return z.literal(spec.value);
    case "enum":
      return z.enum(spec.values as [string, ...string[]]);
    case "array":
      return spec.max === undefined ? z.array(toZod(spec.of)) : z.array(toZod(spec.of)).max(spec.max);
    case "object": {
      const shape = Object.fromEntries(spec.fields.map(([key, field]) => [key, toZod(field)]));
      return spec.strict ? z.strictObject(shape) : z.object(shape);
    }
    case "record":
      return z.record(z.string(), toZod(spec.of));
    case "optional":
      return toZod(spec.of).optional();
    case "nullable":
      return toZod(spec.of).nullable();
    case "union":
      return z.union([toZod(spec.of[0]), toZod(spec.of[1])]);
  }
}

/** JSON values shaped like a spec (so that many cases pass the schema), or anything at all. */
function valueFor(spec: SchemaSpec): fc.Arbitrary<unknown> {
  switch (spec.t) {
    case "string":
      return fc.string({ minLength: spec.min ?? 0, maxLength: 8 });
    case "number":
      return spec.int ? fc.integer() : fc.double({ noNaN: true, noDefaultInfinity: true });
    case "boolean":
      return fc.boolean();
    case "null":
      return fc.constant(null);
    case "literal":
      return fc.constant(spec.value);
    case "enum":
      return fc.constantFrom(...spec.values);
    case "array":
      return fc.array(valueFor(spec.of), { maxLength: spec.max ?? 4 });
    case "object":
      return fc.record(Object.fromEntries(spec.fields.map(([key, field]) => [key, valueFor(field)])));
    case "record":
      return fc.dictionary(fc.string({ maxLength: 4 }), valueFor(spec.of), { maxKeys: 3 });
    case "optional":
      return fc.option(valueFor(spec.of), { nil: undefined });
    case "nullable":
      return fc.option(valueFor(spec.of), { nil: null });
    case "union":
      return fc.oneof(valueFor(spec.of[0]), valueFor(spec.of[1]));
  }
}

/** A spec and data for it: shaped by the spec most of the time, any JSON value otherwise. */
const schemaAndData = schemaSpec.chain((spec) =>
  fc.record({
    spec: fc.constant(spec),
    data: fc.oneof({ weight: 3, arbitrary: valueFor(spec) }, { weight: 1, arbitrary: fc.jsonValue() }),
  }),
);

/** uuidv7-looking job ids, some of them of another version or not UUIDs at all. */
const jobId = fc.oneof(
  { weight: 4, arbitrary: fc.uuid({ version: 7 }) },
  { weight: 1, arbitrary: fc.uuid({ version: 4 }) },
  { weight: 1, arbitrary: fc.string({ maxLength: 40 }) },
);
const field = fc.oneof(
  { weight: 4, arbitrary: fc.string({ minLength: 1, maxLength: 20 }) },
  { weight: 1, arbitrary: fc.constant("") },
  { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 1 }) },
);

/** Envelopes with random fields (each may be missing), a kind that is usually the consumer's, and random data for a random schema. */
const envelopeCase = fc.record({
  schemaAndData,
  envelope: fc.record(
    {
      job_id: jobId,
      tenant_id: field,
      correlation_id: field,
      kind: fc.oneof({ weight: 5, arbitrary: fc.constant(KIND) }, { weight: 1, arbitrary: field }),
      extra: fc.jsonValue({ maxDepth: 1 }),
    },
    { requiredKeys: ["job_id", "tenant_id", "correlation_id", "kind"] },
  ),
  asBytes: fc.boolean(),
});

let seq = 0;

/**
 * Delivers `body` to a fresh consumer of `schema` and checks every property
 * of the outcome; returns it. `expectProcessed` is what an independent
 * reading of the payload says (the envelope and the schema accept it).
 */
async function deliverAndCheck(body: string | Uint8Array, schema: z.ZodType, expectProcessed: boolean) {
  seq += 1;
  const name = `prop.c-${seq}`;
  const consumer = defineConsumer({
    name,
    queue: `prop.q-${seq}`,
    kind: KIND,
    schema,
    async handle(_data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: 1 });
    },
  });
  const bound = bindConsumer(consumer, { db: pg.db, logger: silentLogger });

  let result: DeliveryResult;
  try {
    result = await bound.deliver({ body, deliveryCount: 1 });
  } catch (thrown) {
    throw new Error(`deliver() rejected: ${String(thrown)}`);
  }
  const fences = await pg.db.select().from(processedJobs).where(eq(processedJobs.consumer, name));
  const effectRows = await pg.db.select().from(effects).where(eq(effects.consumer, name));
  const letters = await pg.db.select().from(deadLetters).where(eq(deadLetters.consumer, name));
  const context = JSON.stringify({ result, fences: fences.length, effects: effectRows.length, letters });

  // Processed or exactly one poison letter: nothing else, never both, never neither.
  expect(["success", "poison"], context).toContain(result.outcome);
  // Never an acknowledgement without the row that accounts for it.
  expect(result.ack, context).toBe(true);
  if (result.outcome === "success") {
    expect({ fences: fences.length, effects: effectRows.length, letters: letters.length }, context).toEqual({
      fences: 1,
      effects: 1,
      letters: 0,
    });
  } else {
    expect({ fences: fences.length, effects: effectRows.length, letters: letters.length }, context).toEqual({
      fences: 0,
      effects: 0,
      letters: 1,
    });
    const [letter] = letters;
    if (!letter || result.outcome !== "poison") throw new Error("unreachable");
    expect(letter.errorClass, context).toBe("poison");
    expect(letter.attempts, context).toBe(0);
    expect(letter.status, context).toBe("pending_review");
    expect(result.deadLetterId, context).toBe(letter.id);
    // The stored payload is the bytes received, exactly.
    const received = typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
    const stored = Buffer.from(letter.payload, letter.payloadEncoding as BufferEncoding);
    expect(stored.equals(received), `${context}: stored ${stored.toString("hex")}`).toBe(true);
    expect(letter.payloadSha256, context).toBe(createHash("sha256").update(received).digest("hex"));
  }
  expect(result.outcome, context).toBe(expectProcessed ? "success" : "poison");
  return result;
}

/** What an independent reading says: a valid envelope of the consumer's kind whose data passes the schema. */
function accepts(text: string | undefined, schema: z.ZodType): boolean {
  if (text === undefined) return false;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return false;
  }
  const check = checkEnvelope(value);
  return check.ok && check.envelope.kind === KIND && schema.safeParse(check.envelope.data).success;
}

const anySchema = z.object({ any: z.unknown() });

describe("the poison check under random input (#12 item 2)", () => {
  test("random bytes end as exactly one poison letter holding those bytes, and deliver() never rejects", async () => {
    await fc.assert(
      fc.asyncProperty(fc.uint8Array({ maxLength: 300 }), async (bytes) => {
        let text: string | undefined;
        try {
          text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
        } catch {}
        await deliverAndCheck(bytes, anySchema, accepts(text, anySchema));
      }),
      runs(100),
    );
  }, 120_000);

  test("random JSON text, as a string or as its UTF-8 bytes, ends as exactly one poison letter holding the bytes received", async () => {
    await fc.assert(
      fc.asyncProperty(fc.json({ maxDepth: 4 }), fc.boolean(), async (text, asBytes) => {
        const body = asBytes ? new TextEncoder().encode(text) : text;
        await deliverAndCheck(body, anySchema, accepts(text, anySchema));
      }),
      runs(100),
    );
  }, 120_000);

  test("random envelopes with random data against random Zod schemas end processed or as exactly one poison letter", async () => {
    let processed = 0;
    await fc.assert(
      fc.asyncProperty(envelopeCase, async ({ schemaAndData: { spec, data }, envelope, asBytes }) => {
        const schema = toZod(spec);
        const text = JSON.stringify({ ...envelope, data });
        const body = asBytes ? new TextEncoder().encode(text) : text;
        const result = await deliverAndCheck(body, schema, accepts(text, schema));
        if (result.outcome === "success") processed += 1;
      }),
      runs(200),
    );
    // Not a property: evidence that the generator reaches both outcomes.
    expect(processed).toBeGreaterThan(0);
  }, 120_000);

  test("a valid envelope delivered twice is processed once; the copy is a duplicate with no second row", async () => {
    await fc.assert(
      fc.asyncProperty(schemaAndData, fc.uuid({ version: 7 }), async ({ spec, data }, id) => {
        const schema = toZod(spec);
        const text = JSON.stringify({ job_id: id, tenant_id: "t", correlation_id: "c", kind: KIND, data });
        const first = await deliverAndCheck(text, schema, accepts(text, schema));
        const name = `prop.c-${seq}`;
        const again = await bindConsumer(
          defineConsumer({ name, queue: `prop.q-${seq}`, kind: KIND, schema, handle: async () => {} }),
          { db: pg.db, logger: silentLogger },
        ).deliver({ body: text, deliveryCount: 2 });
        expect(again.outcome).toBe(first.outcome === "success" ? "duplicate" : "poison");
        const letters = await pg.db
          .select()
          .from(deadLetters)
          .where(and(eq(deadLetters.consumer, name), eq(deadLetters.status, "pending_review")));
        const fences = await pg.db.select().from(processedJobs).where(eq(processedJobs.consumer, name));
        expect(letters.length + fences.length).toBe(1);
      }),
      runs(50),
    );
  }, 120_000);
});
