/**
 * The Vercel side of the module's recurring tasks (recurring.ts): one Vercel
 * Cron route per task and its vercel.json `crons` entry, both from the same
 * list. A route file is
 *
 *   // app/api/cron/loyalty-consumption-snapshot/route.ts
 *   const module = await createLoyaltyModule({ transport: "vercel", notifier });
 *   export const GET = loyaltyCronRoutes(module)["loyalty.consumption-snapshot"];
 *
 * Vercel calls it with GET and `Authorization: Bearer $CRON_SECRET`; anything
 * else is refused and every call is audited in `core.ops_audit`
 * (`fanOutCronRoute`). Crons are in UTC and need the Pro plan for more than
 * two or for a period under a day. A server without Vercel Cron runs the same
 * tasks in its worker (`scheduleFanOut`); both at once publish the same jobs.
 */
import {
  type AnyPgDatabase,
  type Clock,
  type FanOutTask,
  fanOutCronRoute,
  InvalidConfigError,
  type QueuePort,
} from "@softcrum/core";
import { RECURRING_TASKS } from "./recurring.ts";

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/**
 * Crons fire this many minutes after each boundary. The route fans out the
 * tick the call falls in (the time floored to the period): a call a moment
 * before the boundary (clock skew, an early start) would fan out the previous
 * tick again and skip this one, while any delay within the period still gives
 * the right tick.
 */
export const CRON_OFFSET_MINUTES = 5;

const slug = (taskName: string) => taskName.replaceAll(".", "-");

/** The URL path Vercel calls for a task: `/api/cron/loyalty-freshness`. */
export const cronPath = (taskName: string) => `/api/cron/${slug(taskName)}`;

/** The route file serving it (Next.js App Router). */
export const cronRouteFile = (taskName: string) => `app${cronPath(taskName)}/route.ts`;

/** The cron expression (five fields, UTC) firing once per period, CRON_OFFSET_MINUTES after each boundary. */
export function cronSchedule(everyMs: number): string {
  const m = CRON_OFFSET_MINUTES;
  if (everyMs < HOUR && HOUR % everyMs === 0 && everyMs % MINUTE === 0 && everyMs > m * MINUTE) {
    const step = everyMs / MINUTE;
    const minutes = Array.from({ length: 60 / step }, (_, i) => m + i * step);
    return `${minutes.join(",")} * * * *`;
  }
  if (everyMs === HOUR) return `${m} * * * *`;
  if (everyMs === DAY) return `${m} 0 * * *`;
  if (everyMs % HOUR === 0 && DAY % everyMs === 0) return `${m} */${everyMs / HOUR} * * *`;
  throw new InvalidConfigError(`no cron expression fires once every ${everyMs} ms on the tick boundaries`);
}

/** What vercel.json's `crons` lists: one entry per recurring task. */
export function loyaltyCrons(): { readonly path: string; readonly schedule: string }[] {
  return RECURRING_TASKS.map((task) => ({ path: cronPath(task.name), schedule: cronSchedule(task.everyMs) }));
}

/**
 * The cron route handler of each task, by task name. Refused when made
 * without a CRON_SECRET of at least 16 characters.
 */
export function loyaltyCronRoutes(
  module: {
    readonly db: AnyPgDatabase;
    readonly queue: QueuePort;
    readonly recurringTasks: readonly FanOutTask[];
  },
  options: {
    /** @default env CRON_SECRET */
    readonly secret?: string;
    readonly env?: Readonly<Record<string, string | undefined>>;
    readonly clock?: Clock;
  } = {},
): Readonly<Record<string, (request: Request) => Promise<Response>>> {
  return Object.fromEntries(
    module.recurringTasks.map((task) => [
      task.name,
      fanOutCronRoute({ task, queue: module.queue, audit: module.db, ...options }),
    ]),
  );
}
