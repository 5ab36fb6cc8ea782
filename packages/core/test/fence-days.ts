/** Test support for the fence's day partitions (ADR 0014): days, job ids of a day, the partitions there are. */
import { randomBytes } from "node:crypto";
import type postgres from "postgres";

/** A UUID v7 whose time is `ms` (random bits from crypto). */
export function v7At(ms: number): string {
  const random = randomBytes(10).toString("hex");
  const variant = ((Number.parseInt(random.slice(3, 4), 16) & 0x3) | 0x8).toString(16);
  const hex = `${ms.toString(16).padStart(12, "0")}7${random.slice(0, 3)}${variant}${random.slice(4, 19)}`;
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** `count` job ids of the UTC day `day` (YYYY-MM-DD), from its noon on, one millisecond apart. */
export function jobsOf(day: string, count: number): string[] {
  const noon = Date.parse(`${day}T12:00:00Z`);
  return Array.from({ length: count }, (_, i) => v7At(noon + i));
}

/** The UTC day `offset` days from the database's today, YYYY-MM-DD. */
export async function dbDay(sql: postgres.Sql, offset: number): Promise<string> {
  const [row] = await sql<{ day: string }[]>`
    select to_char((now() at time zone 'UTC')::date + ${offset}::int, 'YYYY-MM-DD') as day`;
  return row?.day as string;
}

/** The day partitions of core.processed_jobs (YYYY-MM-DD), attached or (with `detached`) not. */
export async function fencePartitions(sql: postgres.Sql, detached = false): Promise<string[]> {
  const rows = await sql<{ day: string }[]>`
    select to_char(to_date(substr(c.relname, 17), 'YYYYMMDD'), 'YYYY-MM-DD') as day
    from pg_class c
    where c.relnamespace = 'core'::regnamespace and c.relkind = 'r' and c.relname ~ '^processed_jobs_p[0-9]{8}$'
      and exists (select 1 from pg_inherits i where i.inhrelid = c.oid) = ${!detached}
    order by 1`;
  return rows.map((r) => r.day);
}

/** Which table holds the fence of (job, consumer): a day partition's name, `processed_jobs_default`, or undefined. */
export async function fenceHome(sql: postgres.Sql, jobId: string, consumer: string): Promise<string | undefined> {
  const [row] = await sql<{ home: string }[]>`
    select tableoid::regclass::text as home from core.processed_jobs where job_id = ${jobId} and consumer = ${consumer}`;
  return row?.home.replace(/^core\./, "");
}

/** Fence rows of `consumer` for `ids`, processed `agoMs` ago (database time). */
export async function insertFences(sql: postgres.Sql, ids: readonly string[], consumer: string, agoMs: number) {
  await sql`
    insert into core.processed_jobs (job_id, consumer, processed_at)
    select unnest(${ids as string[]}::uuid[]), ${consumer}, now() - make_interval(secs => ${agoMs / 1000})`;
}

/** Polls the database until `check` returns a row (a state to reach, not a time to wait). */
export async function waitUntil(check: () => Promise<readonly unknown[]>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if ((await check()).length > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`not reached in 10 s: ${what}`);
}

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

/**
 * Waits, when the database's clock is within `marginMs` before a UTC
 * midnight, or before 23:00 UTC (where the first day created ahead moves:
 * the first midnight at least an hour ahead), until just past it. A test
 * that reads "today" and then has the maintenance read it again must not
 * straddle either edge; CI may run at any hour. (The wait stays under the
 * hooks' 60 s timeout.)
 */
export async function awayFromDayEdges(sql: postgres.Sql, marginMs = 45_000): Promise<void> {
  const [row] = await sql<{ ms: number }[]>`select extract(epoch from clock_timestamp())::float8 * 1000 as ms`;
  const wait = waitPastDayEdge(row?.ms ?? 0, marginMs);
  if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
}

/** How long to wait at epoch ms `now` to be 2 s past an edge less than `marginMs` ahead (23:00 or 24:00 UTC); 0 if none is. */
export function waitPastDayEdge(now: number, marginMs: number): number {
  const intoDay = now % DAY_MS;
  for (const edge of [23 * HOUR_MS, DAY_MS]) {
    const until = edge - intoDay;
    if (until > 0 && until <= marginMs) return until + 2_000;
  }
  return 0;
}
