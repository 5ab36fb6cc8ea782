/**
 * The poison check (SPEC §4 step 1): everything the payload decides before
 * the handler runs — the bytes, the envelope, the kind, the consumer's schema
 * and its ordering key. Module functions of the consumer: nothing is made per
 * delivery but the verdict.
 */
import type { z } from "zod";
import { checkEnvelope, type Envelope, formatIssues } from "./envelope.ts";
import { describeError } from "./errors.ts";
import { decodeBody, type EnvelopeFields, type ReceivedPayload, readableFields } from "./payload.ts";
import { withinMs } from "./timers.ts";

/** What the poison check reads of a consumer. */
export interface CheckedConsumer<TSchema extends z.ZodType> {
  readonly name: string;
  readonly kinds: ReadonlySet<string>;
  readonly schema: TSchema;
  readonly orderingKey?: ((data: z.output<TSchema>, envelope: Envelope) => string) | undefined;
}

/** The result of the poison check: what the handler needs, or why the payload is poison. */
export type Decoded<TData> =
  | {
      ok: true;
      received: ReceivedPayload;
      envelope: Envelope;
      parsed: { data: TData };
      /** The advisory-lock key of the consumer's ordering key, if it has one. */
      lockKey: string | undefined;
    }
  | {
      ok: false;
      received: ReceivedPayload;
      fields: EnvelopeFields;
      error: string;
      alertError?: string;
    };

/**
 * Everything the payload decides before the handler runs: the bytes, the
 * envelope, the kind, the consumer's schema and its ordering key. Anything
 * any of them throws (a schema's `transform`/`refine` calling `new URL` or
 * `BigInt`, a stack overflow on deeply nested data, an `orderingKey` that
 * throws) is poison too: the same payload throws the same way on every
 * delivery, so retrying it can only loop. Never throws.
 */
export function checkPayload<TSchema extends z.ZodType>(
  consumer: CheckedConsumer<TSchema>,
  body: unknown,
  /** How long a schema's asynchronous checks may take; past it the payload is poison. @default no bound */
  asyncWithinMs?: number,
): Decoded<z.output<TSchema>> | Promise<Decoded<z.output<TSchema>>> {
  const progress: DecodeProgress = { received: undefined, fields: {}, stage: "payload", kind: "" };
  try {
    const received = decodeBody(body);
    progress.received = received;
    if (received.decodeError !== undefined) return poisonOf(received, progress.fields, received.decodeError);
    progress.stage = "envelope";
    const check = checkEnvelope(received.value);
    if (!check.ok) {
      progress.fields = readableFields(received.value);
      return poisonOf(received, progress.fields, `invalid envelope: ${check.issues.join("; ")}`);
    }
    const envelope = check.envelope;
    progress.fields = envelope;
    if (!consumer.kinds.has(envelope.kind)) {
      const accepted = [...consumer.kinds].join(", ");
      return poisonOf(
        received,
        progress.fields,
        `kind "${envelope.kind}" is not accepted by ${consumer.name} (accepts ${accepted})`,
      );
    }
    progress.stage = "data";
    progress.kind = envelope.kind;
    const parsed = parseData(consumer.schema, envelope.data);
    // Only a schema with an async refinement or transform makes this wait:
    // every other delivery goes on without a turn of the event loop.
    if (parsed instanceof Promise) {
      const bounded =
        asyncWithinMs === undefined
          ? parsed
          : withinMs(
              parsed,
              asyncWithinMs,
              () => new Error(`the data schema's asynchronous checks did not finish within ${asyncWithinMs} ms`),
            );
      return decodeLater(consumer, progress, received, envelope, bounded);
    }
    return decoded(consumer, progress, received, envelope, parsed);
  } catch (thrown) {
    return thrownWhileDecoding(consumer.name, progress, thrown);
  }
}

async function decodeLater<TSchema extends z.ZodType>(
  consumer: CheckedConsumer<TSchema>,
  progress: DecodeProgress,
  received: ReceivedPayload,
  envelope: Envelope,
  parsing: Promise<z.ZodSafeParseResult<z.output<TSchema>>>,
): Promise<Decoded<z.output<TSchema>>> {
  try {
    return decoded(consumer, progress, received, envelope, await parsing);
  } catch (thrown) {
    return thrownWhileDecoding(consumer.name, progress, thrown);
  }
}

/** The verdict once the data is parsed; the ordering key is computed here (it may throw). */
function decoded<TSchema extends z.ZodType>(
  consumer: CheckedConsumer<TSchema>,
  progress: DecodeProgress,
  received: ReceivedPayload,
  envelope: Envelope,
  parsed: z.ZodSafeParseResult<z.output<TSchema>>,
): Decoded<z.output<TSchema>> {
  if (!parsed.success) {
    return poisonOf(
      received,
      progress.fields,
      `invalid data for ${envelope.kind}: ${formatIssues(parsed.error).join("; ")}`,
    );
  }
  let lockKey: string | undefined;
  if (consumer.orderingKey) {
    progress.stage = "ordering key";
    const key: unknown = consumer.orderingKey(parsed.data, envelope);
    if (typeof key !== "string") {
      return poisonOf(
        received,
        progress.fields,
        `${stageText(progress, consumer.name)}: it returned ${typeof key}, not a string`,
      );
    }
    // The consumer name prefixes the ordering key ("|" cannot occur in a
    // name), so two consumers never wait on each other; Postgres text cannot hold NUL.
    lockKey = `${consumer.name}|${key.replaceAll("\u0000", "")}`;
  }
  return { ok: true, received, envelope, parsed: { data: parsed.data }, lockKey };
}

/** Poison, for whatever a stage of `checkPayload` threw; never throws itself. */
function thrownWhileDecoding(consumerName: string, progress: DecodeProgress, thrown: unknown): Decoded<never> {
  const received = progress.received ?? { text: "", encoding: "utf8" };
  let fields = progress.fields;
  if (fields.job_id === undefined && received.value !== undefined) {
    try {
      fields = readableFields(received.value);
    } catch {} // a value whose fields throw when read: nothing readable
  }
  let described: string;
  try {
    described = describeError(thrown);
  } catch {
    described = "something that cannot even be described"; // e.g. a Proxy that throws on every read
  }
  let name: string;
  try {
    name = thrown instanceof Error ? thrown.name : typeof thrown;
  } catch {
    name = "a value that cannot be read";
  }
  const stage = stageText(progress, consumerName);
  return poisonOf(received, fields, `${stage} threw ${described}`, `${stage} threw ${name}`);
}

/**
 * How far `checkPayload` got, for the poison message of whatever throws: the
 * stage's text is only made then, not for every delivery.
 */
interface DecodeProgress {
  received: ReceivedPayload | undefined;
  fields: EnvelopeFields;
  stage: "payload" | "envelope" | "data" | "ordering key";
  /** The envelope's kind, once read. */
  kind: string;
}

function stageText(progress: DecodeProgress, consumerName: string): string {
  switch (progress.stage) {
    case "payload":
      return "decoding the payload";
    case "envelope":
      return "reading the envelope";
    case "data":
      return `validating data for ${progress.kind}`;
    case "ordering key":
      return `computing ${consumerName}'s ordering key`;
  }
}

/** A poison verdict of `checkPayload` (a module function: no closure made per delivery). */
function poisonOf(
  received: ReceivedPayload,
  fields: EnvelopeFields,
  error: string,
  alertError?: string,
): Decoded<never> {
  return { ok: false, received, fields, error, ...(alertError === undefined ? {} : { alertError }) };
}

/**
 * Synchronous parse (most schemas), and the async one only for a schema with
 * an async refinement or transform, which Zod refuses to run synchronously.
 */
function parseData<TSchema extends z.ZodType>(
  schema: TSchema,
  data: unknown,
): z.ZodSafeParseResult<z.output<TSchema>> | Promise<z.ZodSafeParseResult<z.output<TSchema>>> {
  try {
    return schema.safeParse(data);
  } catch (thrown) {
    let needsAsync = false;
    try {
      needsAsync = (thrown as { constructor?: { name?: unknown } })?.constructor?.name === "$ZodAsyncError";
    } catch {} // a thrown value that throws when read: not Zod's, rethrown as it is
    if (needsAsync) return schema.safeParseAsync(data);
    throw thrown;
  }
}
