/**
 * The two entry points of a recurring fan-out (#20 item 3): a Vercel Cron
 * route (GET, `Authorization: Bearer $CRON_SECRET` compared in constant time,
 * anything else refused; every call audited in `core.ops_audit` when given a
 * database) and a schedule loop for a long-running worker. Both fan out the
 * tick the call falls in (the time floored to the task's period), so a cron
 * retried, or a route and a loop both running, publish the same jobs: the
 * fence applies each once.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { uuidv7 } from "uuidv7";
import { type Clock, systemClock } from "../clock.ts";
import { opsAudit } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import { describeError, InvalidConfigError } from "../errors.ts";
import type { Logger } from "../ports/logger.ts";
import type { QueuePort } from "../queue-port.ts";
import { checkTimerPeriod, sleepUntil } from "../timers.ts";
import { type FanOutReport, fanOut, type TenantSource } from "./fan-out.ts";

/** A recurring fan-out: which jobs, how often, for which tenants. */
export interface FanOutTask {
  /** For logs and the audit, e.g. `snapshots.consumption`. */
  readonly name: string;
  readonly queueName: string;
  readonly kind: string;
  /** The period: one tick per `everyMs`, aligned to the epoch (30 min → :00 and :30 UTC). */
  readonly everyMs: number;
  readonly tenants: TenantSource;
  readonly data?: (tenantId: string, tick: Date) => unknown;
  readonly pageSize?: number;
}

/** The tick `at` falls in: `at` floored to the task's period. */
export function tickAt(at: number, everyMs: number): Date {
  return new Date(Math.floor(at / everyMs) * everyMs);
}

const MIN_CRON_SECRET_LENGTH = 16;
const digest = (text: string) => createHash("sha256").update(text, "utf8").digest();

function checkTask(task: FanOutTask): void {
  if (typeof task?.name !== "string" || task.name === "")
    throw new InvalidConfigError("fan-out task: name is required");
  checkTimerPeriod(`fan-out task ${task.name}: everyMs`, task.everyMs);
  if (task.everyMs < 1_000) throw new InvalidConfigError(`fan-out task ${task.name}: everyMs must be at least 1000`);
}

/** One tick of `task`: what the cron route and the schedule loop run, and what a tick missed while nothing ran is run by hand with. */
export const runFanOutTick = (task: FanOutTask, queue: QueuePort, tick: Date): Promise<FanOutReport> =>
  fanOut({
    queue,
    queueName: task.queueName,
    kind: task.kind,
    tick,
    tenants: task.tenants,
    ...(task.data ? { data: task.data } : {}),
    ...(task.pageSize !== undefined ? { pageSize: task.pageSize } : {}),
  });

/**
 * A route handler (`export const GET = …`) for a vercel.json cron of `task`.
 * 200 with the report when every job was published; 500 when some were not
 * (the next call, or a call by hand, completes the tick); 401/405 refused.
 */
export function fanOutCronRoute(options: {
  readonly task: FanOutTask;
  readonly queue: QueuePort;
  /** @default env CRON_SECRET (Vercel sends it as a Bearer token); at least 16 characters */
  readonly secret?: string;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Where every call is audited (`core.ops_audit`, operator `cron`). @default not audited */
  readonly audit?: AnyPgDatabase;
  readonly clock?: Clock;
}): (request: Request) => Promise<Response> {
  const { task, queue } = options;
  checkTask(task);
  const secret = options.secret ?? (options.env ?? process.env)["CRON_SECRET"] ?? "";
  if (typeof secret !== "string" || secret.length < MIN_CRON_SECRET_LENGTH) {
    throw new InvalidConfigError(
      `fan-out cron route ${task.name}: set CRON_SECRET (or pass secret), at least ${MIN_CRON_SECRET_LENGTH} characters`,
    );
  }
  const expected = digest(`Bearer ${secret}`);
  const clock = options.clock ?? systemClock;
  const audit = async (result: "ok" | "refused" | "error", scope: object, detail: string) => {
    if (!options.audit) return;
    await options.audit.insert(opsAudit).values({
      id: uuidv7(),
      at: new Date(clock.now()),
      operator: "cron",
      action: `fanout.${task.name}`,
      scope,
      result,
      detail,
    });
  };
  return async (request: Request) => {
    if (request.method !== "GET") {
      await audit("refused", {}, `method ${request.method}`);
      return Response.json({ error: "method not allowed" }, { status: 405, headers: { allow: "GET" } });
    }
    // Digests of equal length, compared in constant time: the header's length says nothing either.
    if (!timingSafeEqual(digest(request.headers.get("authorization") ?? ""), expected)) {
      await audit("refused", {}, "missing or wrong bearer token");
      return Response.json({ error: "unauthorized" }, { status: 401 });
    }
    const tick = tickAt(clock.now(), task.everyMs);
    let report: FanOutReport;
    try {
      report = await runFanOutTick(task, queue, tick);
    } catch (error) {
      await audit("error", { tick: tick.toISOString() }, describeError(error));
      return Response.json({ error: describeError(error) }, { status: 500 });
    }
    const complete = report.failed === 0 && report.unconfirmed === 0;
    await audit(
      complete ? "ok" : "error",
      { tick: report.tick },
      `${report.published} of ${report.tenants} published, ${report.unconfirmed} unconfirmed, ${report.failed} failed`,
    );
    return Response.json(report, { status: complete ? 200 : 500 });
  };
}

/**
 * Runs `task` at every tick boundary in this process until `stop()`: for
 * servers without Vercel Cron. A tick missed while the process was down is
 * not made up (run it by hand: `fanOut` with that tick); a run still going at
 * the next boundary delays that tick's run, never overlaps it.
 */
export function scheduleFanOut(
  task: FanOutTask,
  options: {
    readonly queue: QueuePort;
    readonly onRun?: (report: FanOutReport) => void;
    readonly logger?: Logger;
    /** Wall clock for the boundaries. @default Date.now */
    readonly now?: () => number;
  },
): { stop(): Promise<void> } {
  checkTask(task);
  const now = options.now ?? Date.now;
  const controller = new AbortController();
  const loop = (async () => {
    let next = tickAt(now(), task.everyMs).getTime() + task.everyMs;
    while (!controller.signal.aborted) {
      await sleepUntil(next, now, controller.signal);
      if (controller.signal.aborted) break;
      const tick = new Date(next);
      next += task.everyMs;
      try {
        const report = await runFanOutTick(task, options.queue, tick);
        try {
          options.onRun?.(report);
        } catch {}
      } catch (error) {
        options.logger?.error(`fan-out ${task.name} for ${tick.toISOString()} failed: ${describeError(error)}`);
      }
      // A run longer than the period: go on with the tick now current, not every one it missed.
      const current = tickAt(now(), task.everyMs).getTime();
      if (current > next) next = current;
    }
  })();
  return {
    async stop() {
      controller.abort();
      await loop;
    },
  };
}
