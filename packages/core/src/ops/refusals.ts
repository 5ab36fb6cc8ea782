/**
 * Auditing refusals (#10 item 5): every refused mutating call leaves a
 * `core.ops_audit` row, exactly one. The library audits what reaches it and
 * marks the error it audited; a surface (HTTP, CLI) audits only the refusals
 * the library did not see or did not mark (a body that is not JSON, an
 * `operator` field, a batch that does not exist...).
 *
 * Calls that prove no identity are coalesced: one row per source per minute,
 * whose `scope.count` grows, so no caller can grow the audit by sending
 * requests. Sources are capped per process and minute, so neither can a caller
 * that varies its claimed address.
 */
import { createHash } from "node:crypto";
import { sql } from "drizzle-orm";
import type { AnyPgDatabase } from "../db/types.ts";

const AUDITED = Symbol.for("@softcrum/core:ops-audited");

/** Marks an error as already recorded in `core.ops_audit`, so no surface records it again. */
export function markAudited<E>(error: E): E {
  if (typeof error === "object" && error !== null) {
    try {
      Object.defineProperty(error, AUDITED, { value: true, enumerable: false });
    } catch {
      // A frozen error cannot be marked; it is then audited twice, never not at all.
    }
  }
  return error;
}

export function wasAudited(error: unknown): boolean {
  return typeof error === "object" && error !== null && (error as Record<symbol, unknown>)[AUDITED] === true;
}

/** Unauthenticated refusals from more sources than this in one minute (per process) share one row. */
export const MAX_SOURCES_PER_MINUTE = 100;
export const OTHER_SOURCES = "(other sources)";
export const UNAUTHENTICATED_ACTION = "http.unauthenticated";

/**
 * Counts unauthenticated refusals in `core.ops_audit`: one row per (source,
 * minute), whose id is derived from both (a UUID v7 of the minute's start, so
 * id order stays time order), written with an upsert that bumps
 * `scope.count` and the per-action count in `scope.actions`.
 */
export class UnauthenticatedAudit {
  readonly #db: AnyPgDatabase;
  readonly #maxSources: number;
  #minute = -1;
  readonly #sources = new Set<string>();

  constructor(db: AnyPgDatabase, options: { maxSourcesPerMinute?: number } = {}) {
    this.#db = db;
    this.#maxSources = options.maxSourcesPerMinute ?? MAX_SOURCES_PER_MINUTE;
  }

  async record(entry: { source: string; action: string; path: string; detail: string; now: number }): Promise<void> {
    const minute = Math.floor(entry.now / 60_000) * 60_000;
    if (minute !== this.#minute) {
      this.#minute = minute;
      this.#sources.clear();
    }
    let source = entry.source.slice(0, 100) || "unknown";
    if (!this.#sources.has(source)) {
      if (this.#sources.size >= this.#maxSources) source = OTHER_SOURCES;
      else this.#sources.add(source);
    }
    const id = minuteId(minute, source);
    const scope = {
      source,
      minute: new Date(minute).toISOString(),
      count: 1,
      actions: { [entry.action]: 1 },
      lastPath: entry.path.slice(0, 200),
    };
    // Through the database's function (migration 0033): the HTTP API's login
    // may write these counting rows and no other audit row.
    await this.#db.execute(sql`
      select core.ops_count_unauthenticated(${id}::uuid, ${new Date(minute).toISOString()}::timestamptz,
        ${entry.action}, ${JSON.stringify(scope)}::jsonb, ${scope.lastPath}, ${entry.detail.slice(0, 500)})`);
  }
}

/** A UUID v7 whose time is the minute's start and whose random bits are a hash of (minute, source). */
function minuteId(minute: number, source: string): string {
  const hash = createHash("sha256").update(`${minute}|${source}`).digest();
  const bytes = Buffer.alloc(16);
  bytes.writeUIntBE(minute, 0, 6);
  hash.copy(bytes, 6, 0, 10);
  bytes[6] = 0x70 | ((bytes[6] as number) & 0x0f);
  bytes[8] = 0x80 | ((bytes[8] as number) & 0x3f);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
