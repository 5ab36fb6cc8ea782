/**
 * Per-tenant fan-out of recurring work (#20 item 3, SPEC §7): one job per
 * tenant for one tick, its job_id derived from (kind, tenant, tick)
 * (`fanOutJobId`), so running the same tick twice — a retried cron, two
 * schedulers at once, a tick replayed by hand — publishes the same jobs and
 * the consumer's fence applies each once. Tenants come from the module's own
 * store, a keyset page at a time, published with bounded concurrency: memory
 * and time stay flat whatever the number of tenants.
 */
import { createEnvelope } from "../envelope.ts";
import { describeError, InvalidConfigError } from "../errors.ts";
import { publishUntilStored, type QueuePort } from "../queue-port.ts";
import { fanOutJobId } from "./job-id.ts";

/**
 * The next page of tenant ids after `after` (null: from the first), at most
 * `limit`; fewer ends the run. Ascending in JavaScript's string order (code
 * units), which `fanOut` checks page by page: in Postgres, order by a column
 * collated "C" (a locale collation such as en_US sorts differently, and a
 * page would seem to go backwards).
 */
export type TenantSource = (page: {
  readonly tick: Date;
  readonly after: string | null;
  readonly limit: number;
}) => Promise<readonly string[]>;

export interface FanOutOptions {
  /** Where the jobs go. */
  readonly queue: QueuePort;
  readonly queueName: string;
  /** The jobs' kind, version included (`tenant.snapshot.v1`). */
  readonly kind: string;
  /** The tick this run is for (e.g. the hour a cron fired for): the same tick gives the same job_ids. */
  readonly tick: Date;
  readonly tenants: TenantSource;
  /** Each job's data. @default { tick: the tick as ISO 8601 } */
  readonly data?: (tenantId: string, tick: Date) => unknown;
  /** Tenants per page. @default 500 (1..10000) */
  readonly pageSize?: number;
  /** Publishes in flight at once. @default 16 (1..256) */
  readonly concurrency?: number;
  /** Tries of a publish the transport did not confirm stored (a Vercel 202). @default 3 */
  readonly publishTries?: number;
}

export interface FanOutReport {
  readonly tick: string;
  readonly pages: number;
  readonly tenants: number;
  /** Jobs the transport says it stored. */
  readonly published: number;
  /** Jobs only accepted (never confirmed stored) after every try: run the tick again. */
  readonly unconfirmed: number;
  /** Jobs whose publish failed: run the tick again (the ones published are no-ops then). */
  readonly failed: number;
  /** The first failures, for the log. */
  readonly failures: readonly { readonly tenantId: string; readonly error: string }[];
}

const MAX_FAILURES_KEPT = 20;

function bounded(value: number | undefined, fallback: number, min: number, max: number, what: string): number {
  const v = value ?? fallback;
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new InvalidConfigError(`fanOut: ${what} must be an integer from ${min} to ${max}, got ${String(value)}`);
  }
  return v;
}

/** Publishes one job per tenant for `tick`; a run that reports `failed` or `unconfirmed` is safe to run again. */
export async function fanOut(options: FanOutOptions): Promise<FanOutReport> {
  if (!(options.tick instanceof Date) || Number.isNaN(options.tick.getTime())) {
    throw new InvalidConfigError("fanOut: tick must be a valid Date");
  }
  if (typeof options.tenants !== "function") throw new InvalidConfigError("fanOut: tenants must be a page function");
  const pageSize = bounded(options.pageSize, 500, 1, 10_000, "pageSize");
  const concurrency = bounded(options.concurrency, 16, 1, 256, "concurrency");
  const tries = bounded(options.publishTries, 3, 1, 10, "publishTries");
  const { tick, kind, queue, queueName } = options;
  const data = options.data ?? (() => ({ tick: tick.toISOString() }));
  // Checked once, before anything is published: a kind or queue the envelope refuses fails the run now.
  createEnvelope({ jobId: fanOutJobId({ kind, tenantId: "check", tick }), tenantId: "check", kind, data: {} });

  let pages = 0;
  let tenants = 0;
  let published = 0;
  let unconfirmed = 0;
  let failed = 0;
  const failures: { tenantId: string; error: string }[] = [];

  const publishOne = async (tenantId: string) => {
    try {
      const envelope = createEnvelope({
        jobId: fanOutJobId({ kind, tenantId, tick }),
        tenantId,
        kind,
        data: data(tenantId, tick),
      });
      if (await publishUntilStored(queue, queueName, envelope, tries)) published += 1;
      else unconfirmed += 1;
    } catch (error) {
      failed += 1;
      if (failures.length < MAX_FAILURES_KEPT) failures.push({ tenantId, error: describeError(error) });
    }
  };

  let after: string | null = null;
  for (;;) {
    const page = await options.tenants({ tick, after, limit: pageSize });
    if (!Array.isArray(page) || page.length > pageSize) {
      throw new InvalidConfigError(`fanOut: the tenant source must return an array of at most ${pageSize} ids`);
    }
    pages += 1;
    tenants += page.length;
    // Bounded concurrency within the page; the next page is read once this one is done.
    let next = 0;
    const lane = async () => {
      while (next < page.length) await publishOne(page[next++] as string);
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, page.length) }, lane));
    if (page.length < pageSize) break;
    const last = page[page.length - 1] as string;
    if (after !== null && last <= after) {
      throw new InvalidConfigError("fanOut: the tenant source's pages must move forward (ids after `after`, in order)");
    }
    after = last;
  }
  return { tick: tick.toISOString(), pages, tenants, published, unconfirmed, failed, failures };
}
