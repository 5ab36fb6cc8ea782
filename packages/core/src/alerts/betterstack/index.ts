/**
 * `@softcrum/core/alerts/betterstack`: dead-letter alerts to BetterStack
 * through @logtail/node (see docs/adr/0005-betterstack-alerts.md).
 *
 * One alert per new dead letter, with its ids, class, attempts, SQLSTATE and
 * constraint/column/table names, and the error redacted — never the payload,
 * nor a value quoted in the error (see `redactErrorMessage`). Identical
 * failures (same queue, consumer, error class and error fingerprint) inside a
 * window produce the first alert and one summary with how many more there
 * were, not a storm. Given `db`, the windows live in `core.alert_windows` and
 * the whole fleet sends one alert per window; without it, each process
 * coalesces on its own. `flush()` (awaited by the Vercel adapter before a
 * serverless invocation answers) sends what is due and leaves an open
 * window's count in the table, where any process's later flush reports it
 * once the window has ended; `close()` (a worker stopping) sends everything. The SDK resolves even when it dropped a log, so it runs
 * with `throwExceptions` and a failed delivery is counted and logged here; it
 * never blocks the harness or loses the dead-letter row (the row is the
 * evidence).
 */
import { Logtail } from "@logtail/node";
import type { AnyPgDatabase } from "../../consumer.ts";
import { InvalidConfigError } from "../../errors.ts";
import type { AlertPort, DeadLetterAlert } from "../../ports/alerts.ts";
import { consoleLogger, type Logger } from "../../ports/logger.ts";
import type { MetricsPort } from "../../ports/metrics.ts";
import { ALERT_ERROR_MAX, clip, errorFingerprint, redactErrorMessage } from "../redact.ts";
import {
  type AlertWindowKey,
  type AlertWindowStore,
  alertWindowKey,
  type EndedWindow,
  memoryAlertWindows,
  postgresAlertWindows,
  type UnreportedOccurrences,
  type WindowDecision,
} from "../windows.ts";

export { errorFingerprint } from "../redact.ts";

export interface BetterStackAlertOptions {
  /** The BetterStack (Logtail) source token. */
  readonly sourceToken: string;
  /** Ingest URL, used verbatim. @default the SDK's (https://in.logs.betterstack.com) */
  readonly endpoint?: string;
  /** How long identical failures are folded into one alert; 0 alerts every dead letter. @default 300_000 (5 min) */
  readonly coalesceWindowMs?: number;
  /**
   * The database (the harness's) whose `core.alert_windows` coalesces alerts
   * across every process that shares it: the fleet sends one alert per
   * failure mode per window. Without it each process coalesces on its own.
   * If the coalescing query fails or is slow, the alert is sent anyway.
   * @default none: windows in this process
   */
  readonly db?: AnyPgDatabase;
  /** How long the coalescing query may take before the alert is sent without it. @default 5_000 */
  readonly coalesceTimeoutMs?: number;
  /** Passed to the SDK (batchInterval, retryCount, …); throwExceptions is always on. */
  readonly sdkOptions?: Record<string, unknown>;
  /** Counts failed deliveries (`alertFailed`). @default none */
  readonly metrics?: Pick<MetricsPort, "alertFailed">;
  /** @default console */
  readonly logger?: Logger;
  /** The clock windows are measured with (the fleet's clocks are assumed in sync). @default Date.now */
  readonly now?: () => number;
}

export interface BetterStackAlerts extends AlertPort {
  /**
   * Waits until every alert so far is delivered (or failed) or durably
   * counted: alerts and summaries due are sent; a window still open keeps its
   * count in `core.alert_windows` (given `db`; without it the count is sent
   * now, as nothing else would keep it); windows that ended with a count no
   * summary took — their process ended first — are reported. Await it before
   * a serverless function answers (the Vercel adapter does, through the harness).
   */
  flush(): Promise<void>;
  /** For a process that ends: every pending summary is sent now, open windows too; then the timers stop. */
  close(): Promise<void>;
  /** Deliveries that failed so far. */
  readonly failed: number;
}

/** A window this process counted an occurrence in: at its end, someone must report the count. */
interface PendingSummary {
  readonly key: AlertWindowKey;
  readonly windowNumber: number;
  readonly windowStartedAt: number;
  readonly store: AlertWindowStore;
  /** One occurrence's alert, for the summary's wording (all share the fingerprint). */
  readonly sample: DeadLetterAlert;
  readonly timer: NodeJS.Timeout;
}

export function createBetterStackAlerts(options: BetterStackAlertOptions): BetterStackAlerts {
  if (typeof options.sourceToken !== "string" || options.sourceToken.trim() === "") {
    throw new InvalidConfigError("BetterStack alerts: sourceToken is required (the source's token from BetterStack)");
  }
  const windowMs = options.coalesceWindowMs ?? 300_000;
  if (!Number.isFinite(windowMs) || windowMs < 0) {
    throw new InvalidConfigError(`BetterStack alerts: coalesceWindowMs must be >= 0, got ${windowMs}`);
  }
  const timeoutMs = options.coalesceTimeoutMs ?? 5_000;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new InvalidConfigError(`BetterStack alerts: coalesceTimeoutMs must be > 0, got ${timeoutMs}`);
  }
  if (options.db !== undefined && typeof options.db?.execute !== "function") {
    throw new InvalidConfigError("BetterStack alerts: db must be a Drizzle Postgres database");
  }
  const logger = options.logger ?? consoleLogger;
  const now = options.now ?? Date.now;
  const logtail = new Logtail(options.sourceToken, {
    captureStackContext: false,
    ...options.sdkOptions,
    ...(options.endpoint ? { endpoint: options.endpoint } : {}),
    throwExceptions: true,
    ignoreExceptions: false,
  });
  const local = memoryAlertWindows();
  const shared = options.db ? postgresAlertWindows(options.db) : undefined;
  const pending = new Map<string, PendingSummary>();
  /** Coalescing decisions and summaries under way: each may still send. */
  const deciding = new Set<Promise<unknown>>();
  /** Logs handed to the SDK, settled once delivered (or failed). */
  const sending = new Set<Promise<unknown>>();
  let failed = 0;

  const track = <T>(work: Promise<T>, set = deciding): Promise<T> => {
    set.add(work);
    void work.finally(() => set.delete(work)).catch(() => {});
    return work;
  };

  const send = (message: string, context: Record<string, unknown>, about: DeadLetterAlert) => {
    track(
      logtail.error(message, context).then(
        () => undefined,
        (error: unknown) => {
          failed += 1;
          options.metrics?.alertFailed({ queue: about.queue, consumer: about.consumer });
          logger.warn(`BetterStack alert not delivered: ${messageOf(error)}`, {
            deadLetterId: about.deadLetterId,
          });
        },
      ),
      sending,
    );
  };

  const sendAlert = (
    alert: DeadLetterAlert,
    fingerprint: string,
    previous?: { count: number; windowStartedAt: number },
  ) => {
    const more = previous ? `; ${previous.count} more like it in the previous window were not alerted` : "";
    send(
      `dead letter: ${alert.errorClass} in ${alert.consumer} (${alert.queue})${more}`,
      {
        softcrum_alert: "dead_letter",
        dead_letter_id: alert.deadLetterId,
        job_id: alert.jobId,
        queue: alert.queue,
        consumer: alert.consumer,
        tenant_id: alert.tenantId,
        kind: alert.kind,
        correlation_id: alert.correlationId,
        error_class: alert.errorClass,
        attempts: alert.attempts,
        error: alert.error,
        error_fingerprint: fingerprint,
        ...postgresFields(alert),
        ...(previous
          ? {
              previous_window_count: previous.count,
              previous_window_started_at: new Date(previous.windowStartedAt).toISOString(),
            }
          : {}),
      },
      alert,
    );
  };

  /** One summary of a window's unreported count; `sample` (an occurrence's alert) when this process counted one. */
  const report = (taken: UnreportedOccurrences, key: AlertWindowKey, sample?: DeadLetterAlert) => {
    send(
      `${taken.count} more dead letters like ${taken.firstDeadLetterId}: ${key.errorClass} in ${key.consumer} (${key.queue})`,
      {
        softcrum_alert: "dead_letters_coalesced",
        count: taken.count,
        window_ms: now() - taken.windowStartedAt,
        window_started_at: new Date(taken.windowStartedAt).toISOString(),
        first_dead_letter_id: taken.firstDeadLetterId,
        queue: key.queue,
        consumer: key.consumer,
        error_class: key.errorClass,
        error_fingerprint: key.fingerprint,
        ...(sample ? { error: sample.error, ...postgresFields(sample) } : {}),
      },
      sample ?? {
        deadLetterId: taken.firstDeadLetterId,
        jobId: null,
        queue: key.queue,
        consumer: key.consumer,
        tenantId: null,
        kind: null,
        correlationId: null,
        errorClass: key.errorClass,
        attempts: 0,
        error: "",
      },
    );
  };

  /** Takes the window's unreported count (if no other process did) and sends it as one summary. */
  const summarize = async (id: string, summary: PendingSummary) => {
    if (pending.get(id) === summary) pending.delete(id);
    clearTimeout(summary.timer);
    const taking = summary.store.takeUnreported(summary.key, summary.windowNumber);
    let taken: UnreportedOccurrences | undefined;
    try {
      taken = await within(taking, timeoutMs);
    } catch (thrown) {
      // Not taken: the count stays in the table and the next window's first
      // alert carries it. Taken late: reported late, never dropped.
      logger.warn(`alert summary not taken: ${messageOf(thrown)}`, { deadLetterId: summary.sample.deadLetterId });
      taking.then(
        (late) => late && report(late, summary.key, summary.sample),
        () => {},
      );
      return;
    }
    if (taken) report(taken, summary.key, summary.sample);
  };

  /** Reports the windows that ended with a count no summary took (in the shared table: any process's). */
  const sweepEnded = async (at: number) => {
    if (!shared?.takeEnded) return;
    const taking = shared.takeEnded(windowMs, at, SWEEP_LIMIT);
    const reportAll = (ended: EndedWindow[]) => {
      for (const window of ended) report(window, window.key);
    };
    try {
      reportAll(await within(taking, timeoutMs));
    } catch (thrown) {
      // Not taken: the counts stay in the table for the next flush. Taken late: reported late.
      logger.warn(`ended alert windows not taken: ${messageOf(thrown)}`);
      taking.then(reportAll, () => {});
    }
  };

  /** `final`: the process ends, so open windows are summarized too. */
  const settle = async (final: boolean) => {
    // Decisions still on their way may add sends or summaries: wait for them first.
    while (deciding.size > 0) await Promise.allSettled([...deciding]);
    const at = now();
    // A window still open in the shared table keeps its count there, durably;
    // a window of this process only would lose it if the process ended.
    const due = [...pending].filter(
      ([, summary]) => final || summary.store !== shared || summary.windowStartedAt + windowMs <= at,
    );
    await Promise.allSettled(due.map(([id, summary]) => summarize(id, summary)));
    // Then what other processes left (their summaries first: they carry the error's wording).
    await sweepEnded(at);
    // Everything queued goes out now, not at the SDK's next batch.
    await logtail.flush().catch(() => {});
    await Promise.allSettled([...sending]);
  };

  const expectSummary = (
    key: AlertWindowKey,
    decision: Extract<WindowDecision, { send: false }>,
    store: AlertWindowStore,
    sample: DeadLetterAlert,
  ) => {
    const id = `${store === local ? "local" : "shared"}:${alertWindowKey(key)}`;
    const open = pending.get(id);
    if (open?.windowNumber === decision.windowNumber) return;
    // An older window's summary is moot: the process that opened this one carried its count.
    if (open) clearTimeout(open.timer);
    const delay = Math.max(0, decision.windowStartedAt + windowMs - now());
    const summary: PendingSummary = {
      key,
      windowNumber: decision.windowNumber,
      windowStartedAt: decision.windowStartedAt,
      store,
      sample,
      timer: setTimeout(() => void track(summarize(id, summary)), delay),
    };
    summary.timer.unref();
    pending.set(id, summary);
  };

  /** The shared decision, or this process's when the database does not answer in time. */
  const decide = async (key: AlertWindowKey, alert: DeadLetterAlert, at: number) => {
    if (shared) {
      try {
        return {
          decision: await within(shared.record(key, alert.deadLetterId, at, windowMs), timeoutMs),
          store: shared,
        };
      } catch (thrown) {
        // Better one alert too many than none: fall back to this process's windows.
        logger.warn(`alert coalescing through the database failed, coalescing in this process: ${messageOf(thrown)}`, {
          deadLetterId: alert.deadLetterId,
        });
      }
    }
    return { decision: await local.record(key, alert.deadLetterId, at, windowMs), store: local };
  };

  return {
    get failed() {
      return failed;
    },
    deadLetterCreated(input) {
      // Redacted again here: a caller other than the harness may pass a raw error.
      const names = [input.constraint, input.column, input.table].filter((n): n is string => typeof n === "string");
      const alert: DeadLetterAlert = {
        ...input,
        error: redactErrorMessage(clip(input.error), names).slice(0, ALERT_ERROR_MAX),
      };
      const fingerprint = errorFingerprint(alert.error);
      if (windowMs === 0) {
        sendAlert(alert, fingerprint);
        return;
      }
      const key: AlertWindowKey = {
        queue: alert.queue,
        consumer: alert.consumer,
        errorClass: alert.errorClass,
        fingerprint,
      };
      return track(
        (async () => {
          const { decision, store } = await decide(key, alert, now());
          if (decision.send) sendAlert(alert, fingerprint, decision.previous);
          else expectSummary(key, decision, store, alert);
        })(),
      );
    },
    flush: () => settle(false),
    async close() {
      await settle(true);
      for (const summary of pending.values()) clearTimeout(summary.timer);
      pending.clear();
    },
  };
}

/** Most ended windows one flush reports; the rest wait for the next. */
const SWEEP_LIMIT = 50;

/** `work`, or a rejection once `ms` have passed without its answer. */
async function within<T>(work: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      work,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

const messageOf = (thrown: unknown) => (thrown instanceof Error ? thrown.message : String(thrown));

/** The Postgres facts of the alert, only those it has. */
function postgresFields(alert: DeadLetterAlert): Record<string, string> {
  const fields: Record<string, string> = {};
  if (alert.sqlState) fields["sqlstate"] = alert.sqlState;
  if (alert.constraint) fields["constraint"] = alert.constraint;
  if (alert.column) fields["column"] = alert.column;
  if (alert.table) fields["table"] = alert.table;
  return fields;
}
