// Typechecked by package-install.test.ts with `tsc --noEmit` in the scratch
// project, against the .d.ts files the tarball ships (strict,
// exactOptionalPropertyTypes, skipLibCheck off): what a module author writes.
import {
  type BoundConsumer,
  bindConsumer,
  createEnvelope,
  defineConsumer,
  type Envelope,
  PermanentError,
  RateLimitedError,
} from "@softcrum/core";
import { createMemoryQueue, type MemoryQueue } from "@softcrum/core/adapters/memory";
import { coreMigrations, type MigrationSet, migratePostgres } from "@softcrum/core/migrate";
import { sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { z } from "zod";

const schema = z.object({ customerId: z.string(), points: z.number().int().positive() });

export const awardPoints = defineConsumer({
  name: "scratch.award-points",
  queue: "scratch.points",
  kind: "points.award.v1",
  schema,
  orderingKey: (data, envelope) => `${envelope.tenant_id}/${data.customerId}`,
  timeoutMs: 10_000,
  async handle(data, { tx, envelope, idempotencyKey, attempt }) {
    const points: number = data.points;
    if (data.customerId === "closed") throw new PermanentError("account closed");
    if (attempt > 3) throw new RateLimitedError("slow down", { retryAfterMs: 1_000 });
    await tx.execute(sql`insert into ledger values (${envelope.job_id}, ${idempotencyKey}, ${points})`);
  },
});

export function wire(url: string): { queue: MemoryQueue; bound: BoundConsumer } {
  const db = drizzle({ client: postgres(url) });
  const bound = bindConsumer(awardPoints, { db, fenceTtlMs: 8 * 24 * 3_600_000 });
  const queue = createMemoryQueue({ concurrency: 2 });
  queue.subscribe(bound);
  return { queue, bound };
}

export const job: Envelope = createEnvelope({
  tenantId: "acme",
  kind: "points.award.v1",
  data: { customerId: "c1", points: 10 },
});

export const sets: readonly MigrationSet[] = [coreMigrations];
export const migrateAll = (url: string) => migratePostgres(url, coreMigrations);

// The module kit and the testing helpers, as a module's composition root and tests use them.
import { createModule, fromEnv, type InProcessModule, memory, migrateModule } from "@softcrum/core/module";
import { createTestQueue, deadLettersOf, expectOneEffect } from "@softcrum/core/testing";
import { integer, pgTable, text, uuid } from "drizzle-orm/pg-core";

const ledger = pgTable("ledger", {
  jobId: uuid("job_id").primaryKey(),
  customerId: text("customer_id"),
  points: integer(),
});

export async function composition(url: string) {
  const mod = await createModule({ name: "scratch", consumers: [awardPoints], db: url, transport: fromEnv() });
  const local: InProcessModule = await createModule({ name: "scratch", consumers: [awardPoints], transport: memory() });
  await local.settle();
  await Promise.all([mod.close(), local.close()]);
  return migrateModule(url, []);
}

export async function aTest(bound: BoundConsumer, db: Parameters<typeof expectOneEffect>[0]) {
  const queue = createTestQueue({ consumers: [bound] });
  const report = await queue.deliverTwice(job);
  await expectOneEffect(db, ledger, { jobId: job.job_id });
  const letters = await deadLettersOf(db, job.job_id);
  return { report, letters };
}
