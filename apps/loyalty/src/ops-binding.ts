/**
 * What the operator CLI (`pnpm ops`) runs with for this module: the module's
 * database and the queue its replays go to. With the in-process adapter the
 * module's consumers run inside the CLI process, so a replay is consumed
 * before the CLI exits; with a hosted queue the deployed consumers take it.
 *
 * LOYALTY_CLOSED_CUSTOMERS (comma-separated customer ids) keeps rejecting
 * those customers, e.g. to rehearse a replay that fails again.
 */
import type { AnyPgDatabase, QueuePort } from "@softcrum/core";
import type { PartnerNotifier } from "./award-points.ts";
import { createLoyaltyModule } from "./composition-root.ts";

export interface OpsBinding {
  readonly db: AnyPgDatabase;
  readonly queue: QueuePort;
  /** Lets in-flight replays finish, then closes the queue and the database. */
  close(): Promise<void>;
}

/** Stands in for the partner statement service: it accepts every notification. */
const acceptingPartner: PartnerNotifier = { pointsAwarded: async () => {} };

export async function createOpsBinding(options: { databaseUrl: string }): Promise<OpsBinding> {
  const closed = (process.env["LOYALTY_CLOSED_CUSTOMERS"] ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  const module = await createLoyaltyModule({
    databaseUrl: options.databaseUrl,
    notifier: acceptingPartner,
    closedCustomers: new Set(closed),
    logger: { warn: () => {}, error: (message) => console.error(message) },
  });
  return {
    db: module.db,
    queue: module.queue,
    async close() {
      // In-process: the module's consumers run here, let the replays finish
      // (and the partner notifications their credits wrote to the outbox).
      if (module.transport === "memory") await module.settle();
      await module.close();
    },
  };
}
