/**
 * What each running consumer reports of itself (#21 item 6): the build or
 * deployment its composition root runs, and the job kinds it accepts. A
 * replay batch records these for its consumers when it is made (what its
 * approver approved) and refuses to run, or pauses, when a consumer reports
 * another (ops/batches.ts).
 */
import { sql } from "drizzle-orm";
import { InvalidConfigError } from "../errors.ts";
import type { AnyPgDatabase } from "./types.ts";

/** What a consumer reports: its version and its kinds, sorted. */
export interface ConsumerVersion {
  readonly version: string;
  readonly kinds: readonly string[];
}

/** The longest version a consumer may report (a deployment id, a git sha, a semver). */
export const MAX_CONSUMER_VERSION_LENGTH = 200;

/**
 * Records, for each consumer, `version` (the build or deployment id of the
 * composition root that binds it) and the kinds it accepts. Call it once at
 * start, after binding; a later start of another build overwrites it.
 */
export async function reportConsumerVersions(
  db: Pick<AnyPgDatabase, "execute">,
  consumers: readonly { readonly name: string; readonly queue: string; readonly kind: string | readonly string[] }[],
  version: string,
): Promise<void> {
  if (typeof version !== "string" || version.trim() === "" || version.length > MAX_CONSUMER_VERSION_LENGTH) {
    throw new InvalidConfigError(
      `a consumer version must be a non-blank string of at most ${MAX_CONSUMER_VERSION_LENGTH} characters (a build or deployment id), got ${JSON.stringify(version)}`,
    );
  }
  for (const consumer of consumers) {
    const kinds = [...new Set(typeof consumer.kind === "string" ? [consumer.kind] : consumer.kind)].sort();
    await db.execute(sql`
      insert into core.consumer_versions (queue, consumer, version, kinds, reported_at)
      values (${consumer.queue}, ${consumer.name}, ${version}, ${sql.param(kinds)}::text[], now())
      on conflict (queue, consumer) do update
      set version = excluded.version, kinds = excluded.kinds, reported_at = excluded.reported_at`);
  }
}

/** The key of a (queue, consumer) pair in a batch's recorded versions. */
export const versionKey = (queue: string, consumer: string) => `${queue} ${consumer}`;

/** What the consumers of these (queue, consumer) pairs report now, by `versionKey`; unreported pairs are absent. */
export async function reportedVersions(
  db: Pick<AnyPgDatabase, "execute">,
  pairs: readonly { readonly queue: string; readonly consumer: string }[],
): Promise<Record<string, ConsumerVersion>> {
  if (pairs.length === 0) return {};
  const result = await db.execute(sql`
    select v.queue, v.consumer, v.version, v.kinds
    from core.consumer_versions v
    join unnest(${sql.param(pairs.map((p) => p.queue))}::text[], ${sql.param(pairs.map((p) => p.consumer))}::text[])
      as p(queue, consumer) on p.queue = v.queue and p.consumer = v.consumer`);
  const rows = rowsIn<{ queue: string; consumer: string; version: string; kinds: string[] }>(result);
  return Object.fromEntries(
    rows.map((r) => [versionKey(r.queue, r.consumer), { version: r.version, kinds: [...r.kinds].sort() }]),
  );
}

/**
 * Why the consumers running now are not the ones a batch was made for (its
 * `recorded` versions), or undefined when each recorded consumer reports the
 * same version and kinds. A consumer that reports nothing now counts as changed.
 */
export function versionChange(
  recorded: Readonly<Record<string, ConsumerVersion>> | null,
  now: Readonly<Record<string, ConsumerVersion>>,
): string | undefined {
  for (const [key, was] of Object.entries(recorded ?? {})) {
    const is = now[key];
    const [queue, consumer] = key.split(" ");
    if (!is)
      return `consumer "${consumer}" of "${queue}" no longer reports a version (the batch was made for ${was.version})`;
    if (is.version !== was.version) {
      return `consumer "${consumer}" of "${queue}" runs version ${is.version}, not ${was.version} the batch was made and approved for`;
    }
    if (is.kinds.join(",") !== [...was.kinds].sort().join(",")) {
      return `consumer "${consumer}" of "${queue}" accepts kinds ${is.kinds.join(", ")}, not ${was.kinds.join(", ")} as when the batch was made`;
    }
  }
  return undefined;
}

/** The distinct (queue, consumer) of these letters. */
export async function consumersOf(
  tx: Pick<AnyPgDatabase, "execute">,
  ids: string[],
): Promise<{ queue: string; consumer: string }[]> {
  return rowsIn<{ queue: string; consumer: string }>(
    await tx.execute(
      sql`select distinct queue, consumer from core.dead_letters where id = any(${sql.param(ids)}::uuid[])`,
    ),
  );
}

/** The (queue, consumer) pairs of a batch's recorded versions. */
export function pairsOf(recorded: Record<string, unknown> | null): { queue: string; consumer: string }[] {
  return Object.keys(recorded ?? {}).map((key) => {
    const [queue = "", consumer = ""] = key.split(" ");
    return { queue, consumer };
  });
}

/** The rows of a query's result, whichever driver ran it. */
function rowsIn<T>(result: unknown): T[] {
  return (Array.isArray(result) ? result : ((result as { rows?: unknown[] }).rows ?? [])) as T[];
}
