/**
 * The wrapper codec: the bytes the adapter puts around a job it sends on
 * (a deferral, a hop, a rescue before a cap, a delayed or addressed publish).
 * A wrapper says whom the job is for and how many attempts it has spent, so
 * it must come from this adapter (#19): version 3 is signed with an
 * HMAC-SHA256 under the queue's secret (`wrapperSecret`, the same in every
 * deployment that reads the queues), and a body that only looks like a
 * wrapper — unsigned, a bad signature, a foreign producer's bytes — is an
 * ordinary message: the harness judges it (poison, bytes as received), and
 * it sets no consumer and no attempt count.
 *
 * Layout: a one-line JSON header that starts with `{"softcrum_deferral":3,`
 * and ends with the signature, a newline, then the job's bytes unchanged, so
 * a wrapper is never more than `WRAPPER_RESERVE_BYTES` larger than what it
 * carries. Versions 1 and 2 (unsigned, from before #19) are read only when
 * `acceptUnsignedWrappers` is set, for the deploy that introduces signing.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

/** What a wrapper may add to the bytes it carries (the signed header). */
export const WRAPPER_RESERVE_BYTES = 1_024;
/** The least length of a wrapper secret. */
export const MIN_WRAPPER_SECRET_LENGTH = 32;

const WRAPPER_MARK = '{"softcrum_deferral":';
const WRAPPER_V1 = `${WRAPPER_MARK}1,`;
const WRAPPER_V2 = `${WRAPPER_MARK}2,`;
const WRAPPER_V3 = `${WRAPPER_MARK}3,`;
const NEWLINE = 0x0a;
const NEWLINE_BYTES = Buffer.from("\n");

export interface VercelWrapper {
  /** The consumer it is addressed to; undefined: every consumer of the queue (a delayed message). */
  readonly consumer: string | undefined;
  readonly attemptsSpent: number;
  /** Earlier deliveries that ended deferred without spending an attempt; 0 when absent (older wrappers). */
  readonly deferrals: number;
  readonly body: string | Uint8Array;
  /** When the job became due (ms since the epoch): a deferral does not make a job younger. */
  readonly dueAt?: number;
  /** Not to be delivered before this (ms since the epoch): a hop of a wait longer than one message can hold. */
  readonly notBefore?: number;
  /** An operator's replay (`PublishOptions.replay`), kept through deferrals. */
  readonly replay?: boolean;
  /**
   * The delivery this copy succeeds (a republish: a deferral, a hop, a
   * rescue), as `<message key>:<delivery count>`: its first delivery tells
   * the transport-hold store that a predecessor kept on its lease (its
   * republish was not known stored) may now go without running (#19).
   */
  readonly origin?: string;
}

/** Longest `origin` a wrapper carries (a sha256 hex key, a colon, a delivery count). */
const MAX_ORIGIN_LENGTH = 128;

export type WrapperHead = Omit<VercelWrapper, "body">;

/** The header's fields, in the one order both sides build them (the signature covers their JSON). */
function fieldsOf(head: WrapperHead): Record<string, unknown> {
  // Optional fields are left out, so older readers see what they know.
  return {
    ...(head.consumer !== undefined ? { consumer: head.consumer } : {}),
    attempts_spent: head.attemptsSpent,
    ...(head.deferrals > 0 ? { deferrals: head.deferrals } : {}),
    ...(head.dueAt !== undefined ? { due_at: head.dueAt } : {}),
    ...(head.notBefore !== undefined ? { not_before: head.notBefore } : {}),
    ...(head.replay ? { replay: true } : {}),
    ...(head.origin !== undefined ? { origin: head.origin } : {}),
  };
}

function readHead(value: Record<string, unknown>): WrapperHead | undefined {
  const {
    consumer,
    attempts_spent: spent,
    deferrals: deferred = 0,
    due_at: dueAt,
    not_before: notBefore,
    replay,
    origin,
  } = value;
  if (consumer !== undefined && typeof consumer !== "string") return undefined;
  if (origin !== undefined && (typeof origin !== "string" || origin.length > MAX_ORIGIN_LENGTH)) return undefined;
  if (typeof spent !== "number" || !Number.isInteger(spent) || spent < 0) return undefined;
  if (typeof deferred !== "number" || !Number.isInteger(deferred) || deferred < 0) return undefined;
  return {
    consumer,
    attemptsSpent: spent,
    deferrals: deferred,
    ...(typeof dueAt === "number" && Number.isFinite(dueAt) ? { dueAt } : {}),
    ...(typeof notBefore === "number" && Number.isFinite(notBefore) ? { notBefore } : {}),
    ...(replay === true ? { replay: true } : {}),
    ...(typeof origin === "string" ? { origin } : {}),
  };
}

const asBuffer = (bytes: string | Uint8Array) =>
  typeof bytes === "string"
    ? Buffer.from(bytes, "utf8")
    : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);

/** Signs and reads the wrappers of one queue secret. */
export class WrapperCodec {
  readonly #key: Buffer;
  readonly #acceptUnsigned: boolean;

  constructor(secret: string, options: { readonly acceptUnsigned?: boolean } = {}) {
    this.#key = Buffer.from(secret, "utf8");
    this.#acceptUnsigned = options.acceptUnsigned === true;
  }

  /** The wrapper of `body` (version 3, signed). */
  encode(head: WrapperHead, body: string | Uint8Array): Buffer {
    const fields = JSON.stringify(fieldsOf(head));
    const bytes = asBuffer(body);
    const mac = this.#mac(fields, bytes);
    // The mark stays the first bytes: read() looks for it before parsing.
    const header = `${WRAPPER_V3}${fields.slice(1, -1)},"mac":"${mac}"}\n`;
    return Buffer.concat([Buffer.from(header, "utf8"), bytes]);
  }

  /**
   * The wrapper a body carries, or undefined for an ordinary message:
   * anything malformed, unsigned or not signed with this secret is ordinary,
   * and the harness judges it.
   */
  read(bytes: Uint8Array): VercelWrapper | undefined {
    const buffer = asBuffer(bytes);
    const version = versionOf(buffer);
    if (version === 3) {
      const parsed = parseHeader(buffer);
      if (parsed === undefined) return undefined;
      const { value, body } = parsed;
      const head = readHead(value);
      if (head === undefined || typeof value["mac"] !== "string") return undefined;
      const expected = Buffer.from(this.#mac(JSON.stringify(fieldsOf(head)), body), "utf8");
      const given = Buffer.from(value["mac"], "utf8");
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
      return { ...head, body: new Uint8Array(body) };
    }
    if (version !== undefined && this.#acceptUnsigned) return readUnsigned(buffer, version);
    return undefined;
  }

  #mac(fields: string, body: Buffer): string {
    return createHmac("sha256", this.#key).update(fields).update(NEWLINE_BYTES).update(body).digest("base64url");
  }
}

function versionOf(buffer: Buffer): 1 | 2 | 3 | undefined {
  if (buffer.length < WRAPPER_V3.length) return undefined;
  const head = buffer.subarray(0, WRAPPER_V3.length).toString("latin1");
  if (head === WRAPPER_V3) return 3;
  if (head === WRAPPER_V2) return 2;
  if (head === WRAPPER_V1) return 1;
  return undefined;
}

function parseHeader(buffer: Buffer): { value: Record<string, unknown>; body: Buffer } | undefined {
  const end = buffer.indexOf(NEWLINE);
  if (end < 0) return undefined;
  try {
    const value = JSON.parse(buffer.subarray(0, end).toString("utf8")) as unknown;
    if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined;
    return { value: value as Record<string, unknown>, body: buffer.subarray(end + 1) };
  } catch {
    return undefined;
  }
}

/** A wrapper of version 1 or 2 (unsigned), read as it was before #19. */
function readUnsigned(buffer: Buffer, version: 1 | 2 | 3): VercelWrapper | undefined {
  if (version === 2) {
    const parsed = parseHeader(buffer);
    const head = parsed && readHead(parsed.value);
    return head && parsed ? { ...head, body: new Uint8Array(parsed.body) } : undefined;
  }
  try {
    const value = JSON.parse(buffer.toString("utf8")) as Record<string, unknown>;
    const head = readHead(value);
    const { encoding, body } = value;
    if (!head || typeof head.consumer !== "string" || typeof body !== "string") return undefined;
    if (encoding === "utf8") return { ...head, body };
    if (encoding === "base64") return { ...head, body: new Uint8Array(Buffer.from(body, "base64")) };
  } catch {}
  return undefined;
}

/**
 * What a message body on the wire says it carries, unverified: the job's
 * bytes and the wrapper's fields, or undefined for a plain message. For tools
 * and tests that inspect messages (a replay's bytes, a deferral's attempts);
 * the adapter itself reads only signed wrappers (`WrapperCodec.read`).
 */
export function readVercelWrapper(bytes: Uint8Array): Readonly<VercelWrapper> | undefined {
  const buffer = asBuffer(bytes);
  const version = versionOf(buffer);
  if (version === undefined) return undefined;
  if (version !== 3) return readUnsigned(buffer, version);
  const parsed = parseHeader(buffer);
  const head = parsed && readHead(parsed.value);
  return head && parsed ? { ...head, body: new Uint8Array(parsed.body) } : undefined;
}
