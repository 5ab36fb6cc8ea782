/**
 * A delivery's payload as the harness keeps it for evidence: the bytes as
 * received (text, or base64 when they are not UTF-8 or hold NUL, which
 * Postgres text cannot), their SHA-256 (the same message, whichever copy of
 * it this is), the JSON they held, and the envelope fields still readable in
 * an invalid one.
 */
import { createHash } from "node:crypto";

/** The payload as stored in a dead letter, plus what JSON it held (if any). */
export interface ReceivedPayload {
  text: string;
  encoding: "utf8" | "base64";
  value?: unknown;
  decodeError?: string;
}

// ignoreBOM keeps a leading byte-order mark in the text: the letter holds the
// bytes as received (and its hash is theirs), and the JSON is read as the same
// text sent as a string would be (RFC 8259 forbids a BOM; JSON.parse refuses it).
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** The payload of a delivery body, whatever the transport handed over (text, bytes, or JSON it decoded). */
export function decodeBody(body: unknown): ReceivedPayload {
  if (typeof body === "string") return decodeText(body);
  if (body instanceof Uint8Array) {
    let text: string;
    try {
      text = utf8.decode(body);
    } catch {
      return {
        text: Buffer.from(body).toString("base64"),
        encoding: "base64",
        decodeError: "payload is not UTF-8 text",
      };
    }
    return decodeText(text);
  }
  // A transport that already decoded the JSON for us. Text for the dead
  // letter, whatever it is (too deep to stringify, a BigInt, no toString).
  let text: string | undefined;
  try {
    text = JSON.stringify(body);
  } catch {}
  if (text === undefined) {
    try {
      text = String(body);
    } catch {
      text = `[a decoded ${typeof body} that cannot be written as text]`;
    }
  }
  return { ...storable(text), value: body };
}

/** SHA-256 (hex) of the payload's bytes: the same message, whichever copy of it this is. */
export function payloadSha256(received: ReceivedPayload): string {
  return createHash("sha256").update(Buffer.from(received.text, received.encoding)).digest("hex");
}

function decodeText(text: string): ReceivedPayload {
  const stored = storable(text);
  try {
    return { ...stored, value: JSON.parse(text) };
  } catch (thrown) {
    // The parser's message quotes the payload; keep only its kind, since the
    // error also goes into alerts (the payload itself is in the dead letter).
    return { ...stored, decodeError: `payload is not JSON (${thrown instanceof Error ? thrown.name : "parse error"})` };
  }
}

/** Postgres text cannot hold NUL: such payloads are kept as base64 of their UTF-8 bytes. */
function storable(text: string): Pick<ReceivedPayload, "text" | "encoding"> {
  return text.includes("\u0000")
    ? { text: Buffer.from(text, "utf8").toString("base64"), encoding: "base64" }
    : { text, encoding: "utf8" };
}

/** The envelope fields of a payload, as far as they are readable. */
export type EnvelopeFields = { [K in "job_id" | "tenant_id" | "correlation_id" | "kind"]?: string | undefined };

/** The envelope fields of an invalid payload that are still readable, as evidence for the operator. */
export function readableFields(value: unknown): EnvelopeFields {
  if (typeof value !== "object" || value === null) return {};
  const v = value as Record<string, unknown>;
  const pick = (key: string) => (typeof v[key] === "string" ? (v[key] as string) : undefined);
  return {
    job_id: pick("job_id"),
    tenant_id: pick("tenant_id"),
    correlation_id: pick("correlation_id"),
    kind: pick("kind"),
  };
}

/** `value` without NUL, cut to `max` characters (with an ellipsis); null for none. */
export function boundedText(value: string | undefined, max: number): string | null {
  if (value === undefined) return null;
  const clean = value.replaceAll("\u0000", "");
  return clean.length > max ? `${clean.slice(0, max - 1)}…` : clean;
}
