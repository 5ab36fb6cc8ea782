import type { DriverCase } from "./drivers.ts";

/**
 * Records, for each row written to test_effects or core.dead_letters, the
 * synchronous_commit its transaction's COMMIT runs with: a deferred trigger
 * named after core's own (same-event deferred triggers fire in name order),
 * so it runs inside COMMIT after every statement and after core's.
 */
export async function recordCommitModes(c: DriverCase) {
  await c.rows(`create table if not exists test_commit_modes (seq serial, tbl text, mode text)`);
  await c.rows(`truncate test_commit_modes`);
  await c.rows(`create or replace function test_record_commit_mode() returns trigger language plpgsql as $$
    begin insert into test_commit_modes (tbl, mode) values (tg_table_name, current_setting('synchronous_commit')); return null; end $$`);
  for (const table of ["test_effects", "core.dead_letters"]) {
    await c.rows(`create constraint trigger zz_test_commit_mode after insert on ${table}
      deferrable initially deferred for each row execute function test_record_commit_mode()`);
  }
  return {
    modes: async () =>
      (await c.rows<{ tbl: string; mode: string }>("select tbl, mode from test_commit_modes order by seq")).map((r) => [
        r.tbl,
        r.mode,
      ]),
    drop: async () => {
      for (const table of ["test_effects", "core.dead_letters"]) {
        await c.rows(`drop trigger if exists zz_test_commit_mode on ${table}`);
      }
    },
  };
}
