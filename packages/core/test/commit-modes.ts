import type { DriverCase } from "./drivers.ts";

/**
 * Records, for each row written to test_effects or core.dead_letters, the
 * synchronous_commit its transaction's COMMIT runs with. The engine fires
 * every pending deferred trigger right before COMMIT (SET CONSTRAINTS ALL
 * IMMEDIATE), so a deferred trigger on those tables alone would record the
 * setting before the engine's durable setting. Two steps instead: the
 * trigger on the table defers a second one (SET CONSTRAINTS … DEFERRED, then
 * a row of its own), which runs inside COMMIT itself, after every statement
 * sent before it, and records.
 */
export async function recordCommitModes(c: Pick<DriverCase, "rows">) {
  await c.rows(`create table if not exists test_commit_modes (seq serial, tbl text, mode text)`);
  await c.rows(`create table if not exists test_commit_probes (tbl text)`);
  await c.rows(`truncate test_commit_modes`);
  await c.rows(`create or replace function test_record_commit_mode() returns trigger language plpgsql as $$
    begin insert into public.test_commit_modes (tbl, mode) values (new.tbl, pg_catalog.current_setting('synchronous_commit')); return null; end $$`);
  await c.rows(`create or replace function test_probe_commit_mode() returns trigger language plpgsql as $$
    begin
      set constraints public.zz_test_commit_mode_at_commit deferred;
      insert into public.test_commit_probes (tbl) values (tg_table_name);
      return null;
    end $$`);
  await c.rows(`drop trigger if exists zz_test_commit_mode_at_commit on test_commit_probes`);
  await c.rows(`create constraint trigger zz_test_commit_mode_at_commit after insert on test_commit_probes
    deferrable initially deferred for each row execute function test_record_commit_mode()`);
  for (const table of ["test_effects", "core.dead_letters"]) {
    await c.rows(`create constraint trigger zz_test_commit_mode after insert on ${table}
      deferrable initially deferred for each row execute function test_probe_commit_mode()`);
  }
  return {
    modes: async () =>
      (await c.rows<{ tbl: string; mode: string }>("select tbl, mode from test_commit_modes order by seq")).map((r) => [
        r.tbl,
        r.mode,
      ]),
    /** Removes both steps, so later cases of the file (same database) run without them. */
    drop: async () => {
      for (const table of ["test_effects", "core.dead_letters"]) {
        await c.rows(`drop trigger if exists zz_test_commit_mode on ${table}`);
      }
      await c.rows("drop table if exists test_commit_probes");
      await c.rows("drop function if exists test_probe_commit_mode(), test_record_commit_mode()");
    },
  };
}
