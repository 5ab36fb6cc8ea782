/**
 * core.pending_letter_keys (migration 0014, #18 item 6): the fence's
 * pending-letter check reads it instead of core.dead_letters, so it must say
 * exactly which (job_id, consumer) has a `pending_review` letter, whatever
 * writes the letters' table: an insert, an upsert, a status change by one
 * statement or by a batch, a delete, a truncate.
 */

import { uuidv7 } from "uuidv7";
import { expect, test } from "vitest";
import { useEffectsDatabase } from "../../test/fixtures.ts";

const pg = useEffectsDatabase("pending_letter_keys");

async function letter(jobId: string | null, consumer = "keys.c", status = "pending_review"): Promise<string> {
  const id = uuidv7();
  await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class, status)
    values (${id}, ${jobId}, 'q', ${consumer}, '{}', 1, 'e', 'exhausted', ${status})`;
  return id;
}
const keys = () =>
  pg.sql<{ job_id: string; consumer: string; dead_letter_id: string; error_class: string }[]>`
    select job_id, consumer, dead_letter_id::text, error_class from core.pending_letter_keys order by job_id, consumer`;
const pendingLetter = async (jobId: string, consumer = "keys.c") =>
  (await pg.sql<{ detail: string | null }[]>`select core.pending_letter(${jobId}::uuid, ${consumer}) as detail`)[0]
    ?.detail;

test("a pending letter has its key; a replayed, discarded or deleted one has none; one back to pending has it again", async () => {
  const job = uuidv7();
  const id = await letter(job);
  expect(await keys()).toEqual([{ job_id: job, consumer: "keys.c", dead_letter_id: id, error_class: "exhausted" }]);
  expect(await pendingLetter(job)).toBe(`${id} exhausted`);

  await pg.sql`update core.dead_letters set status = 'replayed', status_changed_at = now(), status_changed_by = 'op' where id = ${id}`;
  expect(await keys()).toEqual([]);
  expect(await pendingLetter(job)).toBeNull();

  await pg.sql`update core.dead_letters set status = 'pending_review' where id = ${id}`;
  expect(await pendingLetter(job)).toBe(`${id} exhausted`);
  await pg.sql`update core.dead_letters set status = 'discarded', status_reason = 'duplicate of another', status_changed_at = now(), status_changed_by = 'op' where id = ${id}`;
  expect(await keys()).toEqual([]);

  const again = await letter(job);
  expect(await pendingLetter(job)).toBe(`${again} exhausted`);
  await pg.sql`delete from core.dead_letters where id = ${again}`;
  expect(await keys()).toEqual([]);
});

test("a letter without a valid job_id (poison keyed by its bytes) never has a key; another consumer's letter of the same job is its own key", async () => {
  await letter(null);
  const job = uuidv7();
  const a = await letter(job, "keys.a");
  const b = await letter(job, "keys.b");
  expect((await keys()).map((k) => [k.consumer, k.dead_letter_id])).toEqual([
    ["keys.a", a],
    ["keys.b", b],
  ]);
  expect(await pendingLetter(job, "keys.c")).toBeNull();
});

test("an upsert that folds a copy into the pending letter keeps one key; a batch replay of 2,000 letters removes all their keys in one statement; a truncate removes the rest", async () => {
  const job = uuidv7();
  const id = await letter(job);
  await pg.sql`insert into core.dead_letters as d (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    values (${uuidv7()}, ${job}, 'q', 'keys.c', '{}', 2, 'e2', 'exhausted')
    on conflict (job_id, consumer) where status = 'pending_review' do update set occurrences = d.occurrences + 1`;
  expect((await keys()).map((k) => k.dead_letter_id)).toEqual([id]);

  await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    select gen_random_uuid(), gen_random_uuid()::text, 'q', 'keys.batch', '{}', 1, 'e', 'permanent' from generate_series(1, 2000)`;
  expect((await pg.sql`select 1 from core.pending_letter_keys where consumer = 'keys.batch'`).length).toBe(2000);
  await pg.sql`update core.dead_letters set status = 'replayed', status_changed_at = now(), status_changed_by = 'op' where consumer = 'keys.batch'`;
  expect((await keys()).map((k) => k.consumer)).toEqual(["keys.c"]);

  await pg.sql`truncate core.dead_letters cascade`;
  expect(await keys()).toEqual([]);
});
