import { describe, expect, test } from "vitest";
import { savepointIn, sessionSettingIn, transactionControlIn } from "./transaction-control.ts";

describe("transactionControlIn: what a batched handler may not send", () => {
  test.each([
    ["commit", "commit"],
    ["COMMIT AND CHAIN", "commit"],
    ["  end transaction", "end"],
    ["abort", "abort"],
    ["rollback", "rollback"],
    ["ROLLBACK WORK", "rollback"],
    ["rollback and chain", "rollback"],
    ["prepare transaction 'x'", "prepare transaction"],
    ["select 1; commit", "commit"],
    ["/* a /* nested */ comment */ commit", "commit"],
    ["-- a comment\ncommit", "commit"],
    ["select 'it''s'; commit", "commit"],
    ["select $tag$ ; $tag$; commit", "commit"],
    ["select E'\\'; x'; commit", "commit"],
    ["select e'\\''; commit", "commit"],
    // Non-ASCII letters and $ are identifier characters: é$x$ is one identifier, not a dollar quote.
    ["select 1 as é$x$; commit; select 1 as é$x$", "commit"],
    ["select 1 as é; commit", "commit"],
    // The E of x$e ends an identifier: the string after it is a plain one.
    ["select x$e'\\'; commit; --'", "commit"],
    // A plain string with a backslash, read both ways: standard_conforming_strings off ...
    ["select 'a\\''; commit; select 1 --'", "commit"],
    // ... and on.
    ["select 'a\\'; commit; --'", "commit"],
  ])("%j ends the transaction (%s)", (text, expected) => {
    expect(transactionControlIn(text)).toBe(expected);
  });

  test.each([
    "savepoint sp1",
    "release savepoint sp1",
    "rollback to savepoint sp1",
    "ROLLBACK TO sp1",
    "rollback work to savepoint sp1",
    "select 'commit; rollback'",
    'select 1 as "commit"',
    "select $$ commit $$",
    "select $f$ ; commit; $f$",
    "-- commit\nselect 1",
    "/* commit */ select 1",
    "insert into t (a) values (1) returning a",
    "select case when true then 1 end",
    "update t set ended = true where commit_id = 1",
    "prepare q as select 1",
    "select E'it\\'s; commit'",
    "select $é$ ; commit $é$",
    "select 1 as é$x$, 'commit'",
    "select 'a\\', 'commit'",
  ])("%j does not", (text) => {
    expect(transactionControlIn(text)).toBeUndefined();
  });
});

describe("savepointIn: what a concurrent batch's handler may not send", () => {
  test.each([
    ["savepoint sp1", "savepoint"],
    ["SAVEPOINT sp1", "savepoint"],
    ["release savepoint sp1", "release"],
    ["RELEASE sp1", "release"],
    ["rollback to savepoint sp1", "rollback to"],
    ["ROLLBACK TO sp1", "rollback to"],
    ["rollback work to savepoint sp1", "rollback to"],
    ["select 1; savepoint sp1", "savepoint"],
    ["/* x */ savepoint sp1", "savepoint"],
  ])("%j is a savepoint statement (%s)", (text, expected) => {
    expect(savepointIn(text)).toBe(expected);
  });

  test.each([
    "select 'savepoint sp1'",
    'select 1 as "savepoint"',
    "select $$ release savepoint sp1 $$",
    "-- savepoint sp1\nselect 1",
    "insert into t (savepoint) values (1)",
    "update t set release = 1",
    "rollback",
    "commit",
  ])("%j is none", (text) => {
    expect(savepointIn(text)).toBeUndefined();
  });
});

describe("sessionSettingIn: what would outlive the work transaction on the pooled connection", () => {
  test.each([
    ["set search_path = app", "set"],
    ["SET statement_timeout TO 0", "set"],
    ["set role admin", "set"],
    ["set time zone 'UTC'", "set"],
    ['set "application_name" = x', "set"],
    ["set session authorization admin", "set session"],
    ["SET SESSION synchronous_commit = off", "set session"],
    ["set session characteristics as transaction isolation level serializable", "set session characteristics"],
    ["reset all", "reset"],
    ["RESET search_path", "reset"],
    ["select 1; set search_path = app", "set"],
    ["/* set local */ set x.y = 1", "set"],
  ])("%j does (%s)", (text, expected) => {
    expect(sessionSettingIn(text)).toBe(expected);
  });

  test.each([
    "set local search_path = app",
    "SET LOCAL statement_timeout = 0",
    "set transaction isolation level serializable",
    "set constraints all deferred",
    "set transaction_isolation = 'serializable'",
    "SET transaction_read_only TO on",
    "update t set x = 1",
    "insert into t values (1) on conflict (id) do update set x = 1",
    "with u as (update t set x = 1 returning 1) select 1",
    "select set_config('search_path', 'app', true)",
    "select 'set x = 1'",
    "select $$ reset all $$",
    "-- set x = 1\nselect 1",
  ])("%j does not", (text) => {
    expect(sessionSettingIn(text)).toBeUndefined();
  });
});

test("a text asked again gets the same answer, remembered or not: after 300 other texts, and past the length kept", () => {
  const long = `select '${"x".repeat(3_000)}'; commit`;
  for (let round = 0; round < 2; round++) {
    expect(transactionControlIn("select 1; commit")).toBe("commit");
    expect(savepointIn("savepoint sp1")).toBe("savepoint");
    expect(transactionControlIn("savepoint sp1")).toBeUndefined();
    expect(transactionControlIn(long)).toBe("commit");
    for (let i = 0; i < 300; i++) expect(transactionControlIn(`select ${i}`)).toBeUndefined();
  }
});
