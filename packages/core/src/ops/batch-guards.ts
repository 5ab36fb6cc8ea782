/**
 * What stops a replay batch between chunks besides its own counts (moved
 * out of batches.ts): a deploy of its consumers (#21 item 6) and a
 * dependency straining under it (#21 item 5). A check that cannot read its
 * signal says nothing: the next chunk reads again.
 */
import { sql } from "drizzle-orm";
import { pairsOf, reportedVersions, versionChange } from "../db/consumer-versions.ts";
import type { ReplayBatchRow } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { sleep } from "../timers.ts";
import type { BatchPolicy, SampleReport } from "./batch-input.ts";
import { resolveReplayed, sampleReport, sampleStats } from "./batch-resolution.ts";
import { type DeadLetterOperations, rowsOf } from "./operations.ts";
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

/**
 * Waits until every sample job resolved — succeeded, already done, or failed
 * again: all N outcomes, not the first failure (#21 item 7) — keeping the
 * lease (a timeout is a failure to decide). "passed" when at least one was
 * replayed and none failed again;
 * "lost" when the batch stopped being this runner's to run; else why it pauses.
 */
export async function awaitSample(
  ops: Pick<DeadLetterOperations, "db" | "clock" | "metrics">,
  policy: Pick<BatchPolicy, "sampleTimeoutMs" | "pollIntervalMs">,
  id: string,
  stillMine: () => Promise<boolean>,
  signal: AbortSignal | undefined,
): Promise<string> {
  const deadline = ops.clock.now() + policy.sampleTimeoutMs;
  for (;;) {
    if (!(await stillMine())) return "lost";
    const resolved = await resolveReplayed(ops.db, id, new Date(ops.clock.now()));
    if (resolved.failedAgain > 0) ops.metrics.failedAgain(resolved.failedAgain);
    const stats = await sampleStats(ops.db, id);
    if (stats.unresolved === 0) {
      if (stats.failedAgain > 0) return `sample: ${stats.failedAgain} of ${stats.replayed} sample jobs failed again`;
      // A sample whose letters were all handled elsewhere (discarded,
      // replayed directly) proved nothing: the rest waits for review.
      if (stats.replayed === 0)
        return "sample: none of the sample's letters was replayed by this batch, so nothing was proven";
      return "passed";
    }
    if (signal?.aborted) return "interrupted while waiting for the sample";
    if (ops.clock.now() >= deadline) {
      const failed = stats.failedAgain > 0 ? `, ${stats.failedAgain} failed again` : "";
      return `sample: ${stats.unresolved} of ${stats.replayed} sample jobs did not resolve within ${policy.sampleTimeoutMs} ms${failed}`;
    }
    await sleep(policy.pollIntervalMs, signal);
  }
}

/**
 * After a passing sample, with letters left to replay: shows `confirm` the
 * sample's outcomes beside the selection's error classes. Undefined to go
 * on (no `confirm`, nothing left, or a yes); else the pause's reason — a
 * `sample:` reason, so resuming the batch accepts the sample.
 */
export async function reviewSample(
  db: Db,
  id: string,
  confirm: ((report: SampleReport) => Promise<boolean>) | undefined,
): Promise<string | undefined> {
  if (!confirm) return undefined;
  const report = await sampleReport(db, id);
  if (report.remaining === 0) return undefined;
  const go = await confirm(report).catch(() => false);
  if (go) return undefined;
  return `sample: ${report.items.length} of ${report.items.length} sample jobs resolved without failing again; reviewed, not continued: resume the batch to replay the other ${report.remaining}`;
}

/** Whether the batch is past its expiresAt by the database's clock (a runner's own may lag). */
export async function expiredForDatabase(db: Pick<AnyPgDatabase, "execute">, id: string): Promise<boolean> {
  const [row] = rowsOf<{ expired: boolean }>(
    await db.execute(sql`select expires_at <= now() as expired from core.replay_batches where id = ${id}::uuid`),
  );
  return row?.expired === true;
}
