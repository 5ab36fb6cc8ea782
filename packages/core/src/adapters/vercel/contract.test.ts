import { queuePortContract } from "../../../test/queue-port-contract.ts";
import { vercelHarness } from "../../../test/vercel-transport.ts";

queuePortContract("Vercel Queues, push (route handler)", () => vercelHarness("push"));
queuePortContract("Vercel Queues, poll (worker)", () => vercelHarness("poll"));
