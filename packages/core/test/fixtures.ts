import { type TestDatabase, useTestDatabase } from "@softcrum/testing";
import { integer, pgTable, text, uuid } from "drizzle-orm/pg-core";
import type postgres from "postgres";
import { beforeAll, beforeEach } from "vitest";
import { z } from "zod";
import { type ConsumerDefinition, defineConsumer } from "../src/consumer.ts";
import { PermanentError } from "../src/errors.ts";
import type { AlertPort, DeadLetterAlert } from "../src/ports/alerts.ts";
import type { Logger } from "../src/ports/logger.ts";
import type { JobMetricAttributes, MetricsPort } from "../src/ports/metrics.ts";

/** What a test handler does to the world: one row per applied job, with no unique key, so a double effect shows. */
export const effects = pgTable("test_effects", {
  jobId: uuid("job_id").notNull(),
  consumer: text("consumer").notNull(),
  amount: integer("amount").notNull(),
});

/**
 * A consumer of `points.award.v1` whose handler writes one effect row, then
 * runs `afterWrite` (still inside the work transaction).
 */
export function effectConsumer(name: string, afterWrite: () => Promise<void> = async () => {}) {
  return defineConsumer({
    name,
    queue: "worker.points",
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    async handle(data, { tx, envelope }) {
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: data.points });
      await afterWrite();
    },
  });
}

export async function createEffectsTable(sql: postgres.Sql): Promise<void> {
  await sql`create table if not exists test_effects (job_id uuid not null, consumer text not null, amount integer not null)`;
}

export function recordingMetrics() {
  const processed: JobMetricAttributes[] = [];
  const durations: { ms: number; attributes: JobMetricAttributes }[] = [];
  let alertFailures = 0;
  const port: MetricsPort = {
    jobProcessed: (attributes) => processed.push(attributes),
    handlerDuration: (ms, attributes) => durations.push({ ms, attributes }),
    alertFailed: () => {
      alertFailures += 1;
    },
  };
  return {
    port,
    processed,
    durations,
    get alertFailures() {
      return alertFailures;
    },
    count: (outcome: JobMetricAttributes["outcome"]) => processed.filter((p) => p.outcome === outcome).length,
  };
}

export function recordingAlerts(behaviour: "ok" | "reject" | "throw" = "ok") {
  const sent: DeadLetterAlert[] = [];
  const port: AlertPort = {
    deadLetterCreated(alert) {
      sent.push(alert);
      if (behaviour === "throw") throw new Error("alert sink exploded");
      if (behaviour === "reject") return Promise.reject(new Error("alert sink down"));
      return undefined;
    },
  };
  return { port, sent };
}

export const silentLogger: Logger & { lines: string[] } = {
  lines: [],
  warn(message) {
    this.lines.push(`warn ${message}`);
  },
  error(message) {
    this.lines.push(`error ${message}`);
  },
};

/**
 * Row counts of every base table in the database, by "schema.table"; a
 * partitioned table (the fence, ADR 0014) counts the rows of its partitions,
 * which are not listed apart.
 */
export async function tableCounts(sql: postgres.Sql): Promise<Record<string, number>> {
  const tables = await sql<{ name: string }[]>`
    select quote_ident(t.table_schema) || '.' || quote_ident(t.table_name) as name
    from information_schema.tables t
    join pg_class c on c.oid = (quote_ident(t.table_schema) || '.' || quote_ident(t.table_name))::regclass
    where t.table_type = 'BASE TABLE' and t.table_schema not in ('pg_catalog', 'information_schema')
      and not c.relispartition`;
  const counts: Record<string, number> = {};
  for (const { name } of tables) {
    const [row] = await sql.unsafe<{ n: number }[]>(`select count(*)::int as n from ${name}`);
    counts[name] = row?.n ?? 0;
  }
  return counts;
}

/**
 * A test file's own database with the effects table, and `tables` emptied
 * before each test so every test starts from nothing.
 */
export function useEffectsDatabase(
  label: string,
  tables = "test_effects, core.processed_jobs, core.dead_letters",
): TestDatabase {
  const pg = useTestDatabase(label);
  beforeAll(async () => {
    await createEffectsTable(pg.sql);
  });
  beforeEach(async () => {
    await pg.sql.unsafe(`truncate ${tables} cascade`);
  });
  return pg;
}

/** The data of the `test.v1` consumers made by `testConsumers`. */
export const testJobSchema = z.object({ n: z.number().int() });

/**
 * Makes `test.v1` consumers with names of their own (`<prefix>.c1`, queue
 * `<prefix>.q1`, …), so each test's fences and letters are its own.
 */
export function testConsumers(prefix: string) {
  let seq = 0;
  return (
    handle: ConsumerDefinition<typeof testJobSchema>["handle"],
    extra: Partial<ConsumerDefinition<typeof testJobSchema>> = {},
  ) => {
    seq += 1;
    return defineConsumer({
      name: `${prefix}.c${seq}`,
      queue: `${prefix}.q${seq}`,
      kind: "test.v1",
      schema: testJobSchema,
      handle,
      ...extra,
    });
  };
}

/**
 * A consumer of `points.award.v1` that writes one effect row per job, with
 * two test controls by customer id: `broken` ones fail permanently (a dead
 * letter), `held` ones wait for their promise first.
 */
export function awardConsumer(
  name: string,
  queue: string,
  controls: { broken?: ReadonlySet<string>; held?: ReadonlyMap<string, Promise<void>> } = {},
) {
  return defineConsumer({
    name,
    queue,
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.number() }),
    async handle(data, { tx, envelope }) {
      await controls.held?.get(data.customerId);
      if (controls.broken?.has(data.customerId)) throw new PermanentError(`customer ${data.customerId} is broken`);
      await tx.insert(effects).values({ jobId: envelope.job_id, consumer: name, amount: data.points });
    },
  });
}
