// A loyalty worker process for the SIGTERM alert test (#9 item 8). Starts the
// real worker (startLoyaltyWorker) on DATABASE_URL with BetterStack alerts
// (BETTERSTACK_SOURCE_TOKEN, BETTERSTACK_ENDPOINT: the test's fake ingest),
// dead-letters COUNT jobs of one failure mode through its in-process queue,
// waits for their alerts (the first sent, the rest counted in
// core.alert_windows for the window's summary), prints READY, and stops the
// worker on SIGTERM the way `pnpm worker` does, then exits 0.
//   alerting-worker.ts COUNT
import { createEnvelope } from "@softcrum/core";
import { startLoyaltyWorker } from "../src/worker.ts";

const count = Number(process.argv[2] ?? 3);
const keepAlive = setInterval(() => {}, 2_147_483_647);
const worker = await startLoyaltyWorker({
  notifier: { pointsAwarded: async () => {} },
  transport: "memory",
  fenceTtlMs: 8 * 86_400_000,
  cleanupEveryMs: 3_600_000,
});
process.once("SIGTERM", () => {
  worker.stop().then(
    () => {
      clearInterval(keepAlive);
      process.stdout.write("STOPPED\n", () => process.exit(0));
    },
    (error: unknown) => {
      console.error(`stop failed: ${String(error)}`);
      process.exit(1);
    },
  );
});

const { module } = worker;
if (module.transport !== "memory") throw new Error("expected the in-process queue");
for (let i = 0; i < count; i++) {
  // A kind the consumer does not accept: poison, the same failure mode each time.
  await module.queue.publish(
    module.awardPoints.queue,
    createEnvelope({ tenantId: "acme", kind: "loyalty.retired.v0", data: { i } }),
  );
}
await module.queue.drain();
await module.awardPoints.flushAlerts?.();
process.stdout.write("READY\n");
