/**
 * Resend's wire format as the fake server speaks it (checked against the SDK
 * in node_modules/resend, 6.38.0, and Resend's API reference): what a send
 * must contain, and the error bodies — `{ statusCode, name, message }`, the
 * object the SDK hands back as `error`.
 */

export interface WireError {
  readonly statusCode: number;
  readonly name: string;
  readonly message: string;
}

export const wireError = (statusCode: number, name: string, message: string): WireError => ({
  statusCode,
  name,
  message,
});

/** One e-mail as it arrives on the wire (the SDK's snake_case: reply_to, scheduled_at). */
export interface WireEmail {
  readonly from: string;
  readonly to: readonly string[];
  readonly subject: string;
  readonly html?: string;
  readonly text?: string;
  readonly reply_to?: string | readonly string[];
  readonly tags?: readonly { name: string; value: string }[];
  readonly attachments?: unknown;
  readonly scheduled_at?: string;
}

/** Most recipients one e-mail may have, and most e-mails one batch may hold. */
export const MAX_TO = 50;
export const MAX_BATCH = 100;

const TAG = /^[A-Za-z0-9_-]{1,256}$/;
const ADDRESS = /^[^\s@<>]+@[^\s@<>]+\.[^\s@<>]+$/;

/** The address inside `Name <a@b.c>`, or the string itself. */
function addressOf(value: string): string {
  const m = /<([^>]+)>\s*$/.exec(value);
  return (m ? m[1] : value)?.trim() ?? "";
}

/** A send's body as `WireEmail`, or the error the API answers for it (`where`: `""` or `[3]` in a batch). */
export function checkEmail(value: unknown, where: string, batch: boolean): WireEmail | WireError {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return wireError(422, "validation_error", `${where}: an e-mail must be an object`);
  }
  const e = value as Record<string, unknown>;
  for (const field of ["from", "to", "subject"]) {
    if (e[field] === undefined || e[field] === null || e[field] === "") {
      return wireError(422, "missing_required_field", `${where}Missing \`${field}\` field.`);
    }
  }
  if (typeof e["from"] !== "string" || !ADDRESS.test(addressOf(e["from"]))) {
    return wireError(422, "invalid_from_address", `${where}Invalid \`from\` field.`);
  }
  const to = typeof e["to"] === "string" ? [e["to"]] : e["to"];
  if (!Array.isArray(to) || to.length === 0 || to.some((a) => typeof a !== "string" || !ADDRESS.test(addressOf(a)))) {
    return wireError(422, "validation_error", `${where}Invalid \`to\` field.`);
  }
  if (to.length > MAX_TO)
    return wireError(422, "validation_error", `${where}\`to\` has more than ${MAX_TO} addresses.`);
  if (typeof e["subject"] !== "string") return wireError(422, "validation_error", `${where}Invalid \`subject\` field.`);
  if (typeof e["html"] !== "string" && typeof e["text"] !== "string") {
    return wireError(422, "validation_error", `${where}Either \`html\` or \`text\` must be provided.`);
  }
  const tags = e["tags"];
  if (tags !== undefined && (!Array.isArray(tags) || tags.some((t) => !TAG.test(t?.name) || !TAG.test(t?.value)))) {
    return wireError(422, "validation_error", `${where}Tags may only contain ASCII letters, numbers, _ and -.`);
  }
  if (batch && e["attachments"] !== undefined) {
    return wireError(422, "validation_error", `${where}Attachments are not supported in batch sends.`);
  }
  if (batch && e["scheduled_at"] !== undefined) {
    return wireError(422, "validation_error", `${where}\`scheduled_at\` is not supported in batch sends.`);
  }
  return { ...(e as unknown as WireEmail), to: to as string[] };
}

/** A batch body: 1..100 valid e-mails (strict validation: one bad e-mail refuses the whole batch). */
export function checkBatch(value: unknown): WireEmail[] | WireError {
  if (!Array.isArray(value)) return wireError(422, "validation_error", "The batch must be an array of e-mails.");
  if (value.length === 0) return wireError(422, "validation_error", "The batch must contain at least 1 e-mail.");
  if (value.length > MAX_BATCH) {
    return wireError(422, "validation_error", `The batch must contain at most ${MAX_BATCH} e-mails.`);
  }
  const emails: WireEmail[] = [];
  for (const [i, item] of value.entries()) {
    const checked = checkEmail(item, `emails[${i}]: `, true);
    if ("statusCode" in checked) return checked;
    emails.push(checked);
  }
  return emails;
}

export const isWireError = (value: unknown): value is WireError =>
  typeof value === "object" && value !== null && "statusCode" in value && "name" in value;

/** A seeded PRNG (mulberry32): a 429 storm with a fraction is the same storm on every run. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
