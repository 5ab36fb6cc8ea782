/**
 * The operator tooling's composition root: the one place that decides which
 * database and which transport replays go through, configured from the
 * environment like a module's composition root.
 *
 * - DATABASE_URL: the module's database (opened and checked by `database.ts`;
 *   an in-process module opens its own pool on it for its consumers).
 * - SOFTCRUM_QUEUE=vercel (production): replays are published on Vercel
 *   Queues (configured from VERCEL_REGION, OIDC/VERCEL_OIDC_TOKEN,
 *   VERCEL_DEPLOYMENT_ID), to each consumer's replay topic, for the routes the
 *   modules registered in MODULES. A letter of any other queue or consumer is
 *   refused: nothing is known to read it.
 * - otherwise (local runs): the only transport is in-process. Modules that
 *   offer it (`runInProcess`) run their consumers in this process; a letter of
 *   any other module is refused, since nobody here would ever read its replay.
 *
 * A new module makes its letters replayable by exporting a `ReplayModule`
 * (its consumers' routes) and adding it to MODULES.
 */
import {
  firstRoutingReplay,
  type InProcessConsumers,
  inProcessReplay,
  NOT_IN_PROCESS,
  type ReplayModule,
  type ReplayTransport,
  registeredReplay,
  type StrainMonitor,
} from "@softcrum/core/ops";
import { loyaltyOps } from "@softcrum/example-loyalty/ops-binding";

/** The registry: every module whose dead letters the operator tooling can replay. */
export const MODULES: readonly ReplayModule[] = [loyaltyOps];

export interface ReplayComposition {
  readonly replay: ReplayTransport;
  /** Where the consumers' strain is read, when they run here (in-process); batches pause on it. */
  readonly strain?: StrainMonitor;
  /** "vercel" or "in-process": where replays go. */
  readonly transport: "vercel" | "in-process";
  /** Lets in-process replays finish, then closes the transport. */
  close(): Promise<void>;
}

/** Where replays go, from SOFTCRUM_QUEUE: "vercel", or "in-process" (unset or "memory"). */
export function replayTransportKind(
  env: Readonly<Record<string, string | undefined>> = process.env,
): "vercel" | "in-process" {
  const transport = env["SOFTCRUM_QUEUE"] ?? "memory";
  if (transport !== "memory" && transport !== "vercel") {
    throw new Error(`SOFTCRUM_QUEUE must be "memory" or "vercel", got ${JSON.stringify(transport)}`);
  }
  return transport === "vercel" ? "vercel" : "in-process";
}

/**
 * The transport replays go out through, from the environment. Only commands
 * that publish open it (the database is the CLI's own, `database.ts`).
 */
export async function openReplayTransport(
  options: { readonly databaseUrl: string },
  env: Readonly<Record<string, string | undefined>> = process.env,
  modules: readonly ReplayModule[] = MODULES,
): Promise<ReplayComposition> {
  if (replayTransportKind(env) === "vercel") {
    // Loaded only here, so local runs never need the Vercel SDK.
    const { createVercelQueue } = await import("@softcrum/core/adapters/vercel");
    const queue = createVercelQueue({ env });
    return {
      transport: "vercel",
      replay: registeredReplay(
        queue,
        modules.flatMap((m) => m.routes),
        { transport: "Vercel Queues" },
      ),
      close: () => queue.close(),
    };
  }
  const running: InProcessConsumers[] = [];
  try {
    for (const module of modules) {
      if (module.runInProcess) running.push(await module.runInProcess({ databaseUrl: options.databaseUrl }));
    }
  } catch (error) {
    await Promise.allSettled(running.map((r) => r.close()));
    throw error;
  }
  const strains = running.flatMap((r) => (r.strain ? [r.strain] : []));
  return {
    transport: "in-process",
    ...(strains.length > 0
      ? {
          strain: {
            // Each module counts its own consumers; a batch's consumers may span modules.
            async strain(consumers: readonly string[], from: number, to: number) {
              const parts = await Promise.all(strains.map((s) => s.strain(consumers, from, to)));
              const p95s = parts.flatMap((p) => (p.p95Ms === null ? [] : [p.p95Ms]));
              return {
                deliveries: parts.reduce((n, p) => n + p.deliveries, 0),
                rateLimited: parts.reduce((n, p) => n + p.rateLimited, 0),
                p95Ms: p95s.length > 0 ? Math.max(...p95s) : null,
              };
            },
          },
        }
      : {}),
    replay: firstRoutingReplay(
      running.map((r) => inProcessReplay(r.lanes)),
      { noneReason: NOT_IN_PROCESS },
    ),
    async close() {
      await Promise.allSettled(running.map((r) => r.close()));
    },
  };
}
