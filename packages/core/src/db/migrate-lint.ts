/**
 * A lint over SQL migrations (ADR 0008): refuses statements that lock a hot
 * table — one written by every job — for longer than a moment. Fences
 * (`core.processed_jobs`) are inserted by every job and dead letters by every
 * failure; a lock that blocks writes on them for an index build or a table
 * rewrite stalls every consumer for its whole duration.
 *
 * Refused on a hot table (unless the same migration creates the table, when
 * nothing can be writing to it yet):
 * - CREATE [UNIQUE] INDEX without CONCURRENTLY (a SHARE lock for the build);
 * - REINDEX without CONCURRENTLY, CLUSTER, VACUUM FULL, TRUNCATE, LOCK TABLE;
 * - ALTER TABLE, except `ADD COLUMN` with no DEFAULT/NOT NULL/key/REFERENCES
 *   (metadata only), `ADD CONSTRAINT … NOT VALID` and `VALIDATE CONSTRAINT`.
 * Refused anywhere: DROP INDEX without CONCURRENTLY (ACCESS EXCLUSIVE on the
 * index's table), and CONCURRENTLY in a migration not marked
 * `-- softcrum-migrate: no-transaction` (it would fail inside one).
 * Refused on the partitioned hot table (`core.processed_jobs`) unless the
 * same transaction locked the table itself first (LOCK TABLE, escaped): DROP
 * TRIGGER, which locks the partitions (the trigger's clones) before the
 * table, the reverse of every fence insert's order — a deadlock with live
 * consumers (migration 0029 met it; every retry timed out).
 *
 * "A moment" holds because the runner bounds every lock wait (`lock_timeout`,
 * retried with backoff, #18 item 6): a metadata-only ALTER that needs ACCESS
 * EXCLUSIVE on a table live work transactions hold would otherwise queue
 * every later job behind it for as long as the longest job runs.
 *
 * Escape: a line `-- migration-lint: allow <reason>` inside the statement's
 * chunk (before the statement) lets that statement through; the reason is
 * required. Migrations already applied to deployed databases cannot change
 * (their sha256 is in every database's bookkeeping), so their escapes are
 * listed in APPLIED_ESCAPES, pinned to the file's hash.
 */
import { createHash } from "node:crypto";
import { NO_TRANSACTION_MARKER } from "./migrate.ts";

/** Tables written on every job's path. */
export const HOT_TABLES = ["core.processed_jobs", "core.dead_letters"] as const;
/** The hot tables that are partitioned: a statement that recurses to the partitions may lock them first. */
const PARTITIONED_HOT_TABLES: readonly string[] = ["core.processed_jobs"];

export const ESCAPE = "-- migration-lint: allow";

/** Escapes for migrations that were deployed before the lint: file name → its sha256 and why it may pass. */
export const APPLIED_ESCAPES: Record<string, { readonly sha256: string; readonly reason: string }> = {
  "0001_replay_batches_and_audit.sql": {
    sha256: "9a37b0c171ff5a3c0068bad86cfe6d75640abba4e9713d218130374755ed9635",
    reason:
      "applied before #9: dead_letters_job_consumer_idx was built without CONCURRENTLY; dead letters were few then, and the file cannot change",
  },
  "0002_fence_expiry_index.sql": {
    sha256: "cd5e337a05b75528ce40f5065331887c3cbb7f5951a27c6c461c749a551891ea",
    reason:
      "applied before #9: replaced the fence expiry index in a transaction; on a new database the table is empty, and the file cannot change",
  },
  "0004_poison_dedupe.sql": {
    sha256: "a579b484e46fba8e77ef65fa611c65c5ddd381e56fea150cfa7c09089629473a",
    reason:
      "applied before #9: dead_letters_one_pending_per_payload_without_job was built without CONCURRENTLY, and the file cannot change",
  },
};

export interface LintProblem {
  readonly file: string;
  readonly statement: string;
  readonly problem: string;
}

const normalize = (text: string) =>
  text
    .replace(/--[^\n]*/g, " ")
    .replaceAll('"', "")
    .replace(/\s+/g, " ")
    .trim()
    .replace(/\s*;$/, "");

/** The problems of one migration file (`name` is its file name, e.g. `0006_x.sql`). */
export function lintMigration(name: string, text: string): LintProblem[] {
  const applied = APPLIED_ESCAPES[name];
  if (applied && applied.sha256 === createHash("sha256").update(text).digest("hex")) return [];
  const noTransaction = text.trimStart().startsWith(NO_TRANSACTION_MARKER);
  const chunks = text.split("--> statement-breakpoint");
  const createdHere = new Set(
    chunks.flatMap((chunk) => {
      const m = /^CREATE TABLE (?:IF NOT EXISTS )?([\w.]+)/i.exec(normalize(chunk));
      return m?.[1] ? [m[1].toLowerCase()] : [];
    }),
  );
  const hot = HOT_TABLES.filter((t) => !createdHere.has(t));
  const problems: LintProblem[] = [];
  // Tables this migration's transaction has locked whole so far (none in a
  // no-transaction file: each statement commits on its own).
  const locked = new Set<string>();
  for (const chunk of chunks) {
    const statement = normalize(chunk);
    if (statement === "") continue;
    const allow = chunk.split("\n").find((line) => line.trim().startsWith(ESCAPE));
    const found = problemOf(statement, hot, noTransaction, locked);
    // Only ACCESS EXCLUSIVE (LOCK's default) keeps fence inserts out while
    // DROP TRIGGER takes the partitions: a weaker mode does not conflict with theirs.
    const lock = /^LOCK (?:TABLE )?(?:ONLY )?([\w.]+)(?: IN (.+) MODE)?(?: NOWAIT)?$/i.exec(statement);
    const exclusive = lock !== null && (lock[2] === undefined || /^ACCESS EXCLUSIVE$/i.test(lock[2]));
    if (exclusive && lock?.[1] !== undefined && !noTransaction) locked.add(lock[1].toLowerCase());
    if (!found) continue;
    if (allow && allow.trim().slice(ESCAPE.length).trim() !== "") continue;
    problems.push({
      file: name,
      statement: statement.slice(0, 160),
      problem: allow ? `${found} (the escape comment needs a reason)` : found,
    });
  }
  return problems;
}

function problemOf(
  statement: string,
  hot: readonly string[],
  noTransaction: boolean,
  locked: ReadonlySet<string>,
): string | undefined {
  const s = statement.toUpperCase();
  if (/\bCONCURRENTLY\b/.test(s) && !noTransaction) {
    return `CONCURRENTLY cannot run in a transaction: start the file with "${NO_TRANSACTION_MARKER}"`;
  }
  if (/^DROP INDEX\b/.test(s) && !/^DROP INDEX CONCURRENTLY\b/.test(s)) {
    return "DROP INDEX without CONCURRENTLY takes ACCESS EXCLUSIVE on the index's table";
  }
  const onHot = (pattern: RegExp) => {
    const m = pattern.exec(statement);
    const table = m?.[1]?.toLowerCase();
    return table && hot.includes(table) ? table : undefined;
  };
  const indexed = onHot(/^CREATE (?:UNIQUE )?INDEX (?!CONCURRENTLY\b)(?:IF NOT EXISTS )?\S+ ON (?:ONLY )?([\w.]+)/i);
  if (indexed) return `CREATE INDEX on ${indexed} without CONCURRENTLY blocks its writes for the whole build`;
  const heavy = onHot(
    /^(?:REINDEX (?:TABLE|INDEX) (?!CONCURRENTLY\b)|CLUSTER |VACUUM FULL |TRUNCATE (?:TABLE )?|LOCK (?:TABLE )?)([\w.]+)/i,
  );
  if (heavy) return `this statement locks ${heavy} against writes for its whole run`;
  // The trigger's name may be quoted, spaces and all (normalize dropped the quotes).
  const trigger = onHot(/^DROP TRIGGER (?:IF EXISTS )?.+? ON (?:ONLY )?([\w.]+)$/i);
  if (trigger && PARTITIONED_HOT_TABLES.includes(trigger) && !locked.has(trigger)) {
    return `DROP TRIGGER on ${trigger} locks its partitions before the table, the reverse of a live fence insert's order (a deadlock): first, in the same migration, LOCK TABLE ${trigger} IN ACCESS EXCLUSIVE MODE, with an "${ESCAPE} <reason>" line (the lock is brief: the drop changes no row)`;
  }
  const altered = onHot(/^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?([\w.]+)/i);
  if (altered) {
    const actions = statement.replace(/^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?[\w.]+ /i, "").split(/,(?![^(]*\))/);
    const unsafe = actions.find((action) => !metadataOnly(action.trim()));
    if (unsafe !== undefined)
      return `ALTER TABLE ${altered} "${unsafe.trim()}" may rewrite or scan the table under ACCESS EXCLUSIVE`;
  }
  return undefined;
}

function metadataOnly(action: string): boolean {
  const a = action.toUpperCase();
  if (/^ADD (?:COLUMN )?(?:IF NOT EXISTS )?/.test(a) && !/^ADD CONSTRAINT\b/.test(a)) {
    return !/\b(DEFAULT|NOT NULL|PRIMARY KEY|UNIQUE|REFERENCES|GENERATED|CHECK)\b/.test(a);
  }
  if (/^ADD CONSTRAINT\b/.test(a)) return /\bNOT VALID$/.test(a);
  return /^VALIDATE CONSTRAINT\b/.test(a);
}
