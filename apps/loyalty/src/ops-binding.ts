/**
 * What the loyalty module contributes to the operator tooling (`pnpm ops`,
 * Softcrum Ops): the replay routes of its consumers, so that the tooling's
 * registry knows its letters are replayable, and — for local runs with no
 * hosted queue — a way to run its consumers inside the tooling's process.
 *
 * A new module does the same: export a `ReplayModule` with
 * `consumers.map(replayRouteOf)` and add it to the tooling's list of modules
 * (`apps/ops/src/composition.ts`). In production the replays go out on Vercel
 * Queues, to each consumer's replay topic, which the module's deployed route
 * serves (a second trigger); locally, without `runInProcess`, its letters are
 * refused rather than published where nobody reads them.
 *
 * In-process, the partner is a stand-in that accepts every notification
 * (there is no partner service on a laptop); LOYALTY_CLOSED_CUSTOMERS
 * (comma-separated customer ids) keeps rejecting those customers, e.g. to
 * rehearse a replay that fails again.
 */
import { type ReplayModule, replayRouteOf, strainRecorder } from "@softcrum/core/ops";
import { createAwardPointsConsumer, createNotifyPartnerConsumer, type PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule } from "./composition-root.ts";
import { createRecurringConsumer } from "./recurring-jobs.ts";

/** Stands in for the partner statement service in local runs: it accepts every notification. */
const acceptingPartner: PartnerNotifier = { pointsAwarded: async () => {} };

export const loyaltyOps: ReplayModule = {
  name: "loyalty",
  // Consumer definitions only: nothing is opened to list them.
  routes: [
    createAwardPointsConsumer(),
    createNotifyPartnerConsumer({ notifier: acceptingPartner }),
    createRecurringConsumer(),
  ].map(replayRouteOf),
  async runInProcess({ databaseUrl }) {
    const closed = (process.env["LOYALTY_CLOSED_CUSTOMERS"] ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    // Its consumers' rate-limited outcomes and latency: a batch run here pauses on their strain.
    const strain = strainRecorder();
    const module = await createLoyaltyModule({
      metrics: strain.metrics,
      databaseUrl,
      transport: "memory",
      notifier: acceptingPartner,
      closedCustomers: new Set(closed),
      logger: { warn: () => {}, error: (message) => console.error(message) },
    });
    return {
      lanes: module.queue,
      strain,
      async close() {
        // The consumers run here: let the replays finish (and the partner
        // notifications their credits wrote to the outbox), then close.
        await module.settle();
        await module.close();
      },
    };
  },
};
