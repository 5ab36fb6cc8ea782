import { queuePortContract } from "../../../test/queue-port-contract.ts";
import { vercelHarness } from "../../../test/vercel-transport.ts";

queuePortContract("Vercel Queues, push (route handler)", () => vercelHarness("push"));
queuePortContract("Vercel Queues, poll (worker)", () => vercelHarness("poll"));
// The service drops a message after its trigger's maxDeliveries, with no dead-letter queue (#11 item 1).
queuePortContract("Vercel Queues, push, trigger capped at maxAttempts + 2", () =>
  vercelHarness("push", { maxDeliveries: 7 }),
);
queuePortContract("Vercel Queues, poll, group capped at maxAttempts + 2", () =>
  vercelHarness("poll", { maxDeliveries: 7 }),
);
