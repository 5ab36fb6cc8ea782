/**
 * The loyalty module's Vercel Queues push routes and their vercel.json
 * triggers, from the consumer definitions (#11 item 1). One source for both:
 * the composition root binds each route with these options (so the adapter
 * knows the trigger's `maxDeliveries` and `retryAfterSeconds`), and
 * `pnpm --filter @softcrum/example-loyalty vercel:json` writes `vercel.json`
 * from them (a test checks the file is what they produce).
 *
 * Every trigger option is written out: the service's defaults are
 * undocumented (an older trigger version dropped a message after 3
 * deliveries). `maxConcurrency` is sized against the database: each delivery
 * holds one connection at a time, and the module's pool has 10.
 *
 * The file also lists the Vercel Crons of the module's recurring tasks
 * (`crons`, from cron-routes.ts), whose jobs the recurring route consumes.
 */
import { type VercelFunctionsConfig, vercelFunctionsConfig, vercelTrigger } from "@softcrum/core/adapters/vercel";
import { createAwardPointsConsumer, createNotifyPartnerConsumer } from "./award-points.ts";
import { loyaltyCrons } from "./cron-routes.ts";
import { createRecurringConsumer } from "./recurring-jobs.ts";

/** Connections of the module's Postgres pool (`openPostgres`), shared by its three routes. */
export const LOYALTY_POOL_SIZE = 10;

type TriggerConsumer = Parameters<typeof vercelTrigger>[0];

/**
 * The trigger of each push route, from the consumers as the module defines
 * them. The recurring jobs get 2 connections: they are a few per tenant per
 * hour and not urgent within minutes, while credits are what customers wait on.
 */
export function loyaltyTriggers(
  consumers: {
    readonly awardPoints?: TriggerConsumer;
    readonly notifyPartner?: TriggerConsumer;
    readonly recurring?: TriggerConsumer;
  } = {},
) {
  return {
    awardPoints: vercelTrigger(consumers.awardPoints ?? createAwardPointsConsumer(), {
      route: "app/api/queues/loyalty-points/route.ts",
      databaseConnections: 5,
      retryAfterSeconds: 60,
      maxDeliveries: 12,
    }),
    notifyPartner: vercelTrigger(
      consumers.notifyPartner ?? createNotifyPartnerConsumer({ notifier: { pointsAwarded: async () => {} } }),
      {
        route: "app/api/queues/loyalty-partner-notifications/route.ts",
        databaseConnections: LOYALTY_POOL_SIZE - 5 - 2,
        retryAfterSeconds: 60,
        maxDeliveries: 12,
      },
    ),
    recurring: vercelTrigger(consumers.recurring ?? createRecurringConsumer(), {
      route: "app/api/queues/loyalty-recurring/route.ts",
      databaseConnections: 2,
      retryAfterSeconds: 60,
      maxDeliveries: 12,
    }),
  };
}

/** What apps/loyalty/vercel.json holds. */
export function loyaltyVercelJson(): VercelFunctionsConfig & {
  readonly $schema: string;
  readonly crons: ReturnType<typeof loyaltyCrons>;
} {
  const triggers = loyaltyTriggers();
  return {
    $schema: "https://openapi.vercel.sh/vercel.json",
    ...vercelFunctionsConfig([triggers.awardPoints, triggers.notifyPartner, triggers.recurring]),
    crons: loyaltyCrons(),
  };
}
