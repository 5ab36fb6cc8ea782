import { defineConsumer, PermanentError, type RetryPolicy } from "@softcrum/core";
import { sql } from "drizzle-orm";
import { z } from "zod";
import { balances, ledger } from "./schema.ts";

export const AWARD_POINTS_QUEUE = "loyalty.points";
export const AWARD_POINTS_KIND = "points.award.v1";

export const awardPointsData = z.object({
  customerId: z.string().min(1).max(100),
  points: z.number().int().positive().max(1_000_000),
  reason: z.string().min(1).max(200),
});
export type AwardPoints = z.infer<typeof awardPointsData>;

/**
 * The partner that is told about each credit (a statement or e-mail service).
 * It is outside the database transaction, so it gets the harness's
 * idempotency key and must de-duplicate by it.
 */
export interface PartnerNotifier {
  pointsAwarded(input: {
    idempotencyKey: string;
    jobId: string;
    tenantId: string;
    customerId: string;
    points: number;
  }): Promise<void>;
}

export interface AwardPointsOptions {
  readonly notifier: PartnerNotifier;
  /** Customers whose accounts are closed: awarding them is a business rejection. */
  readonly closedCustomers?: ReadonlySet<string>;
  /** Only the demo overrides this (see demo.ts); production runs the platform default. */
  readonly retry?: Partial<RetryPolicy>;
}

/** Credits points: one ledger row and the balance, in the harness's transaction. */
export function createAwardPointsConsumer(options: AwardPointsOptions) {
  return defineConsumer({
    name: "loyalty.award-points",
    queue: AWARD_POINTS_QUEUE,
    kind: AWARD_POINTS_KIND,
    schema: awardPointsData,
    // One customer's credits apply one at a time: the balance upsert never races.
    orderingKey: (data, envelope) => `${envelope.tenant_id}/${data.customerId}`,
    ...(options.retry ? { retry: options.retry } : {}),
    async handle(data, { tx, envelope, idempotencyKey }) {
      if (options.closedCustomers?.has(data.customerId)) {
        throw new PermanentError(`customer ${data.customerId} has a closed account`);
      }
      await tx.insert(ledger).values({
        jobId: envelope.job_id,
        tenantId: envelope.tenant_id,
        customerId: data.customerId,
        points: data.points,
        reason: data.reason,
      });
      await tx
        .insert(balances)
        .values({ tenantId: envelope.tenant_id, customerId: data.customerId, points: data.points })
        .onConflictDoUpdate({
          target: [balances.tenantId, balances.customerId],
          set: { points: sql`${balances.points} + excluded.points`, updatedAt: sql`now()` },
        });
      // Last, so a partner failure rolls the credit back and the retry redoes both.
      await options.notifier.pointsAwarded({
        idempotencyKey,
        jobId: envelope.job_id,
        tenantId: envelope.tenant_id,
        customerId: data.customerId,
        points: data.points,
      });
    },
  });
}
