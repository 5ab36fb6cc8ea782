/**
 * The chaos run's verdict in SQL: every job has exactly one effect or exactly
 * one pending letter, every garbage payload one poison letter, every fence
 * its effect and every effect its fence.
 */
import type postgres from "postgres";
import { CHAOS_CONSUMER, type ChaosData } from "./consumer.ts";

export interface Sent {
  readonly jobs: Map<string, { fate: ChaosData["fate"] | "poison"; copies: number }>;
  /** Payloads sent without a job_id a consumer could read (another stack's garbage): their SHA-256. */
  readonly garbage: Set<string>;
}

export interface Verdict {
  effects: number;
  /** Letters pending review at the end. */
  deadLetters: number;
  lost: number;
  doubled: number;
  orphanFences: number;
  problems: string[];
  lostJobs: string[];
}

/**
 * Every job: exactly one effect (and its fence), or exactly one
 * pending_review letter (earlier letters of it may be `replayed`) — never
 * both, never neither, never two effects. Garbage payloads: exactly one
 * poison letter each. Every fence has its effect and every effect its fence.
 */
export async function check(sql: postgres.Sql, sent: Sent): Promise<Verdict> {
  const problems: string[] = [];
  const ids = [...sent.jobs.keys()];
  const rows = await sql<{ job_id: string; effects: number; fences: number; pending: number; replayed: number }[]>`
    with jobs as (select unnest(${ids}::uuid[]) as job_id),
    e as (select job_id, count(*)::int as n from chaos_effects group by job_id),
    f as (select job_id, count(*)::int as n from core.processed_jobs where consumer = ${CHAOS_CONSUMER} group by job_id),
    l as (
      select job_id, count(*) filter (where status = 'pending_review')::int as pending,
             count(*) filter (where status = 'replayed')::int as replayed
      from core.dead_letters where consumer = ${CHAOS_CONSUMER} and job_id is not null group by job_id)
    select jobs.job_id::text, coalesce(e.n, 0) as effects, coalesce(f.n, 0) as fences,
           coalesce(l.pending, 0) as pending, coalesce(l.replayed, 0) as replayed
    from jobs left join e on e.job_id = jobs.job_id left join f on f.job_id = jobs.job_id
    left join l on l.job_id = jobs.job_id::text`;
  let lost = 0;
  let doubled = 0;
  const lostJobs: string[] = [];
  for (const row of rows) {
    const fate = sent.jobs.get(row.job_id)?.fate;
    const what = `job ${row.job_id} (${fate}): ${row.effects} effects, ${row.fences} fences, ${row.pending} pending letters, ${row.replayed} replayed`;
    if (row.effects === 0 && row.pending === 0) {
      lost += 1;
      lostJobs.push(row.job_id);
      problems.push(`lost ${what}`);
    } else if (row.effects > 1 || row.pending > 1 || (row.effects > 0 && row.pending > 0)) {
      doubled += 1;
      problems.push(`doubled ${what}`);
    } else if (fate === "poison" && row.effects > 0) {
      doubled += 1;
      problems.push(`poison applied: ${what}`);
    }
  }
  const garbage = [...sent.garbage];
  const letters = await sql<{ sha: string; n: number }[]>`
    select payload_sha256 as sha, count(*)::int as n from core.dead_letters
    where consumer = ${CHAOS_CONSUMER} and job_id is null and status = 'pending_review' and error_class = 'poison'
    group by payload_sha256`;
  const bySha = new Map(letters.map((l) => [l.sha, l.n]));
  for (const sha of garbage) {
    const found = bySha.get(sha) ?? 0;
    if (found === 0) {
      lost += 1;
      problems.push(`lost garbage payload ${sha}: no poison letter`);
    } else if (found > 1) {
      doubled += 1;
      problems.push(`doubled garbage payload ${sha}: ${found} letters`);
    }
  }
  const [orphans] = await sql<{ fences: number; effects: number; strangers: number }[]>`
    select
      (select count(*)::int from core.processed_jobs p where consumer = ${CHAOS_CONSUMER}
         and not exists (select 1 from chaos_effects e where e.job_id = p.job_id)) as fences,
      (select count(*)::int from chaos_effects e
         where not exists (select 1 from core.processed_jobs p where p.job_id = e.job_id and p.consumer = ${CHAOS_CONSUMER})) as effects,
      (select count(*)::int from chaos_effects e where not (e.job_id = any(${ids}::uuid[]))) as strangers`;
  const orphanFences = (orphans?.fences ?? 0) + (orphans?.effects ?? 0);
  if (orphanFences > 0)
    problems.push(`${orphans?.fences} fences without effect, ${orphans?.effects} effects without fence`);
  if ((orphans?.strangers ?? 0) > 0) {
    doubled += orphans?.strangers ?? 0;
    problems.push(`${orphans?.strangers} effects of jobs nobody sent`);
  }
  // The balances were written in the same transactions as the effects.
  const [sums] = await sql<{ effects: string; balances: string; count: number; pending: number }[]>`
    select (select coalesce(sum(amount), 0)::text from chaos_effects) as effects,
           (select coalesce(sum(points), 0)::text from chaos_balances) as balances,
           (select count(*)::int from chaos_effects) as count,
           (select count(*)::int from core.dead_letters where status = 'pending_review') as pending`;
  const classes = await sql<{ error_class: string; status: string; n: number }[]>`
    select error_class, status, count(*)::int as n from core.dead_letters group by 1, 2 order by 1, 2`;
  console.log(
    `chaos: letters ${classes.map((c) => `${c.error_class}/${c.status} ${c.n}`).join(", ")}; total sent ${sent.jobs.size} jobs + ${sent.garbage.size} garbage payloads`,
  );
  if (sums?.effects !== sums?.balances) problems.push(`balances ${sums?.balances} != effects ${sums?.effects}`);
  return {
    effects: sums?.count ?? 0,
    deadLetters: sums?.pending ?? 0,
    lost,
    doubled,
    orphanFences,
    problems,
    lostJobs,
  };
}

/**
 * A producer retries a publish that failed (a keep-alive socket the server
 * closed as it was reused answers ECONNRESET): a retried publish may store the
 * job twice, which is what at-least-once means; the fence makes it harmless.
 */
