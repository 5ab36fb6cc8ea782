/**
 * Assertions on what jobs left in the database: one effect per job, the
 * job's dead letters, its fence. Framework-neutral: a failed expectation
 * throws node:assert's AssertionError, which Vitest, node:test and Jest all
 * report as a failure.
 */
import { AssertionError } from "node:assert";
import { and, asc, count, eq, getTableColumns, is, isNull, SQL } from "drizzle-orm";
import { getTableConfig, PgDialect, type PgTable } from "drizzle-orm/pg-core";
import { deadLetters, processedJobs } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";

/** Which rows: a Drizzle condition (`eq(ledger.jobId, id)`), or column values by property name (`{ jobId: id }`). */
export type RowFilter<T extends PgTable> = SQL | { readonly [K in keyof T["$inferSelect"]]?: T["$inferSelect"][K] };

/**
 * Checks that `table` holds exactly one row matching `where` (every row when
 * left out) and returns it; otherwise throws an AssertionError naming the
 * table, the condition and how many rows there were. What a test of an
 * idempotent consumer asserts after a retry or a duplicate delivery.
 *
 * @example await expectOneEffect(db, ledger, { jobId: envelope.job_id });
 */
export async function expectOneEffect<T extends PgTable>(
  db: AnyPgDatabase,
  table: T,
  where?: RowFilter<T>,
): Promise<T["$inferSelect"]> {
  const condition = toCondition(table, where);
  const from: PgTable = table;
  const [counted] = await db.select({ n: count() }).from(from).where(condition);
  const found = Number(counted?.n ?? 0);
  if (found !== 1) {
    const name = tableName(table);
    const filter = where === undefined ? "" : describeFilter(where);
    throw new AssertionError({
      message: `expectOneEffect: expected exactly 1 row in ${name}${filter ? ` where ${filter}` : ""}, found ${found}`,
      actual: found,
      expected: 1,
      operator: "expectOneEffect",
    });
  }
  const [row] = await db.select().from(from).where(condition).limit(1);
  return row as T["$inferSelect"];
}

/** A dead letter, as a test looks at it. */
export interface JobDeadLetter {
  readonly id: string;
  readonly queue: string;
  readonly consumer: string;
  /** `pending_review`, `replayed` or `discarded`. */
  readonly status: string;
  /** `poison`, `exhausted`, `permanent` or `expired`. */
  readonly errorClass: string;
  readonly lastError: string;
  readonly attempts: number;
  readonly occurrences: number;
}

/**
 * The dead letters of a job (`core.dead_letters`), oldest first, of every
 * consumer or of `options.consumer` only. Empty when it has none.
 */
export async function deadLettersOf(
  db: AnyPgDatabase,
  jobId: string,
  options: { readonly consumer?: string } = {},
): Promise<JobDeadLetter[]> {
  return db
    .select({
      id: deadLetters.id,
      queue: deadLetters.queue,
      consumer: deadLetters.consumer,
      status: deadLetters.status,
      errorClass: deadLetters.errorClass,
      lastError: deadLetters.lastError,
      attempts: deadLetters.attempts,
      occurrences: deadLetters.occurrences,
    })
    .from(deadLetters)
    .where(
      and(
        eq(deadLetters.jobId, jobId),
        options.consumer === undefined ? undefined : eq(deadLetters.consumer, options.consumer),
      ),
    )
    .orderBy(asc(deadLetters.createdAt), asc(deadLetters.id));
}

/** A job's idempotency fence for one consumer. */
export interface JobFence {
  readonly jobId: string;
  readonly consumer: string;
  readonly processedAt: Date;
}

/**
 * The fence `consumer` wrote for `jobId` (`core.processed_jobs`), written in
 * the same transaction as the handler's work; undefined when there is none
 * (the work did not commit, or the fence expired and was cleaned up).
 */
export async function fenceOf(db: AnyPgDatabase, jobId: string, consumer: string): Promise<JobFence | undefined> {
  const [row] = await db
    .select()
    .from(processedJobs)
    .where(and(eq(processedJobs.jobId, jobId), eq(processedJobs.consumer, consumer)));
  return row;
}

function toCondition<T extends PgTable>(table: T, where: RowFilter<T> | undefined): SQL | undefined {
  if (where === undefined || is(where, SQL)) return where;
  const columns = getTableColumns(table) as Record<string, Parameters<typeof eq>[0]>;
  const parts = Object.entries(where as Record<string, unknown>).map(([key, value]) => {
    const column = columns[key];
    if (!column) {
      throw new TypeError(
        `expectOneEffect: ${tableName(table)} has no column property "${key}" (it has ${Object.keys(columns).join(", ")})`,
      );
    }
    return value === null ? isNull(column) : eq(column, value);
  });
  return and(...parts);
}

function tableName(table: PgTable): string {
  const { schema, name } = getTableConfig(table);
  return schema ? `${schema}.${name}` : name;
}

function describeFilter(where: SQL | object): string {
  if (is(where, SQL)) {
    const query = new PgDialect().sqlToQuery(where);
    return query.params.length > 0 ? `${query.sql} (params ${query.params.map(show).join(", ")})` : query.sql;
  }
  return Object.entries(where)
    .map(([key, value]) => `${key} = ${show(value)}`)
    .join(" and ");
}

function show(value: unknown): string {
  if (typeof value === "bigint") return `${value}n`;
  if (value instanceof Date) return value.toISOString();
  return JSON.stringify(value) ?? String(value);
}
