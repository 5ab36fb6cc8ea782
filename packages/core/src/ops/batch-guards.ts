/**
 * What stops a replay batch between chunks besides its own counts (moved
 * out of batches.ts): a deploy of its consumers (#21 item 6) and a
 * dependency straining under it (#21 item 5). A check that cannot read its
 * signal says nothing: the next chunk reads again.
 */
import { pairsOf, reportedVersions, versionChange } from "../db/consumer-versions.ts";
import type { ReplayBatchRow } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { BASELINE_WINDOW_MS, type ConsumerStrain, type StrainMonitor, strainReason } from "./strain.ts";

type Db = Pick<AnyPgDatabase, "execute">;

/** Why the consumers running now are not those the batch was made and approved for; undefined when they are. */
export async function versionMoved(
  db: Db,
  batch: Pick<ReplayBatchRow, "consumerVersions">,
): Promise<string | undefined> {
  return versionChange(batch.consumerVersions, await reportedVersions(db, pairsOf(batch.consumerVersions)));
}

/** The consumers' strain over the window before the batch starts: its baseline; undefined without a monitor. */
export async function strainBaseline(
  strain: StrainMonitor | undefined,
  consumers: readonly string[],
  startedAt: number,
): Promise<ConsumerStrain | undefined> {
  if (!strain) return undefined;
  return Promise.resolve(strain.strain(consumers, startedAt - BASELINE_WINDOW_MS, startedAt)).catch(() => undefined);
}

/** The stop a batch makes after a chunk for its consumers' version or strain, or undefined. */
export async function stopBetweenChunks(input: {
  readonly db: Db;
  readonly batch: Pick<ReplayBatchRow, "consumerVersions" | "maxRateLimitedMultiple" | "maxLatencyMultiple">;
  readonly strain: StrainMonitor | undefined;
  readonly baseline: ConsumerStrain | undefined;
  readonly consumers: readonly string[];
  readonly startedAt: number;
  readonly now: number;
}): Promise<{ reason: string; cause: string } | undefined> {
  const moved = await versionMoved(input.db, input.batch).catch(() => undefined);
  if (moved) return { reason: `consumer version changed: ${moved}`, cause: "consumer_version" };
  if (!input.strain || !input.baseline) return undefined;
  const during = await Promise.resolve(input.strain.strain(input.consumers, input.startedAt, input.now)).catch(
    () => undefined,
  );
  const strained = during && strainReason(input.baseline, during, input.batch);
  return strained ? { reason: strained, cause: "dependency_strain" } : undefined;
}
