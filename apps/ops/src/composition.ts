/**
 * The operator tooling's composition root: the one place that decides which
 * database and which transport replays go through, configured from the
 * environment like a module's composition root.
 *
 * - DATABASE_URL: the database holding `core.dead_letters` (never migrated
 *   here: operator commands only check that it is).
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
import type { AnyPgDatabase } from "@softcrum/core";
import { assertMigrated, coreMigrations, postgresJsSession } from "@softcrum/core/migrate";
import {
  firstRoutingReplay,
  type InProcessConsumers,
  inProcessReplay,
  NOT_IN_PROCESS,
  type ReplayModule,
  type ReplayTransport,
  registeredReplay,
} from "@softcrum/core/ops";
import { loyaltyOps } from "@softcrum/example-loyalty/ops-binding";

/** The registry: every module whose dead letters the operator tooling can replay. */
export const MODULES: readonly ReplayModule[] = [loyaltyOps];

export interface OpsComposition {
  readonly db: AnyPgDatabase;
  readonly replay: ReplayTransport;
  /** "vercel" or "in-process": where replays go. */
  readonly transport: "vercel" | "in-process";
  /** Lets in-process replays finish, then closes the transport and the database. */
  close(): Promise<void>;
}

export async function openOps(
  env: Readonly<Record<string, string | undefined>> = process.env,
  modules: readonly ReplayModule[] = MODULES,
): Promise<OpsComposition> {
  const databaseUrl = env["DATABASE_URL"];
  if (!databaseUrl) throw new Error("DATABASE_URL is not set: the CLI works on the module's database");
  const transport = env["SOFTCRUM_QUEUE"] ?? "memory";
  if (transport !== "memory" && transport !== "vercel") {
    throw new Error(`SOFTCRUM_QUEUE must be "memory" or "vercel", got ${JSON.stringify(transport)}`);
  }
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const client = postgres(databaseUrl, { max: 10, onnotice: () => {} });
  try {
    await assertMigrated(postgresJsSession(client), [coreMigrations]);
  } catch (error) {
    await client.end();
    throw error;
  }
  const db = drizzle({ client }) as unknown as AnyPgDatabase;

  if (transport === "vercel") {
    // Loaded only here, so local runs never need the Vercel SDK.
    const { createVercelQueue } = await import("@softcrum/core/adapters/vercel");
    const queue = createVercelQueue({ env });
    return {
      db,
      transport: "vercel",
      replay: registeredReplay(
        queue,
        modules.flatMap((m) => m.routes),
        { transport: "Vercel Queues" },
      ),
      async close() {
        await queue.close();
        await client.end();
      },
    };
  }

  const running: InProcessConsumers[] = [];
  try {
    for (const module of modules) {
      if (module.runInProcess) running.push(await module.runInProcess({ databaseUrl }));
    }
  } catch (error) {
    await Promise.allSettled(running.map((r) => r.close()));
    await client.end();
    throw error;
  }
  return {
    db,
    transport: "in-process",
    replay: firstRoutingReplay(
      running.map((r) => inProcessReplay(r.lanes)),
      { noneReason: NOT_IN_PROCESS },
    ),
    async close() {
      await Promise.allSettled(running.map((r) => r.close()));
      await client.end();
    },
  };
}
