import { createEnvelope, defineConsumer, PermanentError, type RetryPolicy } from "@softcrum/core";
import { sql } from "drizzle-orm";
import { z } from "zod";
import { balances, ledger } from "./schema.ts";

export const AWARD_POINTS_QUEUE = "loyalty.points";
/** How long credited points stay valid: the ledger row's `expires_at` (the expiring-soon scan reads it). */
export const POINTS_VALID_DAYS = 365;
export const AWARD_POINTS_KIND = "points.award.v1";

export const awardPointsData = z.object({
  customerId: z.string().min(1).max(100),
  points: z.number().int().positive().max(1_000_000),
  reason: z.string().min(1).max(200),
});
export type AwardPoints = z.infer<typeof awardPointsData>;

/**
 * The partner that is told about each credit (a statement or e-mail service).
 * It is outside the database, so it is never called inside the credit's
 * transaction: the credit writes a notification job to the outbox, and the
 * notify consumer below calls the partner with the harness's idempotency key,
 * which the partner must de-duplicate by.
 */
export interface PartnerNotifier {
  pointsAwarded(input: {
    idempotencyKey: string;
    /** The award job whose credit this notification reports. */
    jobId: string;
    tenantId: string;
    customerId: string;
    points: number;
    /** Fires when the notify consumer's run passes its `timeoutMs`: pass it to the HTTP call. */
    signal?: AbortSignal;
  }): Promise<void>;
}

export const PARTNER_NOTIFY_QUEUE = "loyalty.partner-notifications";
export const PARTNER_NOTIFY_KIND = "partner.points-awarded.v1";

export const partnerNotifyData = z.object({
  /** The award job that credited the points. */
  awardJobId: z.uuid(),
  customerId: z.string().min(1).max(100),
  points: z.number().int().positive().max(1_000_000),
});
export type PartnerNotify = z.infer<typeof partnerNotifyData>;

export interface AwardPointsOptions {
  /** Customers whose accounts are closed: awarding them is a business rejection. */
  readonly closedCustomers?: ReadonlySet<string>;
  /** Only the demo overrides this (see demo.ts); production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
}

/**
 * Credits points: one ledger row and the balance, in the harness's
 * transaction, and — in the same transaction — a job that tells the partner.
 * That job reaches its queue only if the credit commits; nothing outside the
 * database is called while the transaction holds its connection and locks.
 */
export function createAwardPointsConsumer(options: AwardPointsOptions = {}) {
  return defineConsumer({
    name: "loyalty.award-points",
    queue: AWARD_POINTS_QUEUE,
    kind: AWARD_POINTS_KIND,
    schema: awardPointsData,
    // One customer's credits apply one at a time: the balance upsert never races.
    orderingKey: (data, envelope) => `${envelope.tenant_id}/${data.customerId}`,
    ...(options.retry ? { retry: options.retry } : {}),
    async handle(data, { tx, envelope, outbox }) {
      if (options.closedCustomers?.has(data.customerId)) {
        throw new PermanentError(`customer ${data.customerId} has a closed account`);
      }
      await tx.insert(ledger).values({
        jobId: envelope.job_id,
        tenantId: envelope.tenant_id,
        customerId: data.customerId,
        points: data.points,
        reason: data.reason,
        expiresAt: sql`now() + make_interval(days => ${POINTS_VALID_DAYS})`,
      });
      await tx
        .insert(balances)
        .values({ tenantId: envelope.tenant_id, customerId: data.customerId, points: data.points })
        .onConflictDoUpdate({
          target: [balances.tenantId, balances.customerId],
          set: { points: sql`${balances.points} + excluded.points`, updatedAt: sql`now()` },
        });
      // Not the partner call itself: a job for it, committed with the credit.
      await outbox.publish(
        PARTNER_NOTIFY_QUEUE,
        createEnvelope<PartnerNotify>({
          tenantId: envelope.tenant_id,
          correlationId: envelope.correlation_id,
          kind: PARTNER_NOTIFY_KIND,
          data: { awardJobId: envelope.job_id, customerId: data.customerId, points: data.points },
        }),
      );
    },
  });
}

export interface NotifyPartnerOptions {
  readonly notifier: PartnerNotifier;
  /** Only the demo overrides this (see demo.ts); production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
}

/**
 * Tells the partner about one credit. The call is outside any transaction
 * that matters (the fence's holds no business lock), it is retried on its own
 * schedule, and a partner that stays down dead-letters the notification —
 * never the credit. The idempotency key is the same on every retry and
 * redelivery of this job, so the partner applies it once.
 */
export function createNotifyPartnerConsumer(options: NotifyPartnerOptions) {
  return defineConsumer({
    name: "loyalty.notify-partner",
    queue: PARTNER_NOTIFY_QUEUE,
    kind: PARTNER_NOTIFY_KIND,
    schema: partnerNotifyData,
    ...(options.retry ? { retry: options.retry } : {}),
    async handle(data, { envelope, idempotencyKey, signal }) {
      await options.notifier.pointsAwarded({
        idempotencyKey,
        jobId: data.awardJobId,
        tenantId: envelope.tenant_id,
        customerId: data.customerId,
        points: data.points,
        signal,
      });
    },
  });
}
