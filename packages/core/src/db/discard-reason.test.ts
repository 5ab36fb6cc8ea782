import { useTestDatabase } from "@softcrum/testing";
import { describe, expect, test } from "vitest";
import { reasonSchema } from "../ops/filters.ts";

const pg = useTestDatabase("discard-reason");

// Every character JavaScript's trim() strips (so the API refuses a reason made of them).
const BLANKS = [
  "\t",
  "\n",
  "\v",
  "\f",
  "\r",
  " ",
  "\u00a0",
  "\u1680",
  ...Array.from({ length: 11 }, (_, i) => String.fromCharCode(0x2000 + i)),
  "\u2028",
  "\u2029",
  "\u202f",
  "\u205f",
  "\u3000",
  "\ufeff",
];

async function pendingLetter(): Promise<string> {
  const [row] = await pg.sql<{ id: string }[]>`
    insert into core.dead_letters (id, queue, consumer, payload, attempts, last_error, error_class)
    values (gen_random_uuid(), 'q', 'c', '{}', 1, 'e', 'permanent') returning id`;
  return row?.id as string;
}

describe("a blank discard reason is refused by the database as by the API (#10 item 7)", () => {
  test.each([
    ["a tab", "\t"],
    ["spaces and line breaks", " \n \r\n "],
    ["a no-break and an ideographic space", "\u00a0\u3000"],
    ["every character trim() strips", BLANKS.join("")],
  ])("an insert of a discarded letter whose reason is %s is refused", async (_name, reason) => {
    expect(reasonSchema.safeParse(reason).success).toBe(false);
    await expect(
      pg.sql`
        insert into core.dead_letters (id, queue, consumer, payload, attempts, last_error, error_class,
                                       status, status_changed_at, status_changed_by, status_reason)
        values (gen_random_uuid(), 'q', 'c', '{}', 1, 'e', 'permanent', 'discarded', now(), 'ana', ${reason})`,
    ).rejects.toMatchObject({ code: "23514", constraint_name: "dead_letters_discard_reason_not_blank" });
  });

  test("an update that discards with any single blank character as the reason is refused, letter by letter", async () => {
    const id = await pendingLetter();
    for (const blank of BLANKS) {
      expect(reasonSchema.safeParse(blank).success, JSON.stringify(blank)).toBe(false);
      await expect(
        pg.sql`update core.dead_letters set status = 'discarded', status_changed_at = now(),
                 status_changed_by = 'ana', status_reason = ${`${blank}${blank}`} where id = ${id}`,
        JSON.stringify(blank),
      ).rejects.toMatchObject({ code: "23514" });
    }
    const [row] = await pg.sql<{ status: string }[]>`select status from core.dead_letters where id = ${id}`;
    expect(row?.status).toBe("pending_review");
  });

  test("a reason with any visible character passes both, even surrounded by blanks (a zero-width space is not blank for either)", async () => {
    for (const reason of [" \t refunded (#4411)\r\n", "\u200b", "é"]) {
      expect(reasonSchema.safeParse(reason).success, JSON.stringify(reason)).toBe(true);
      const id = await pendingLetter();
      await pg.sql`update core.dead_letters set status = 'discarded', status_changed_at = now(),
                     status_changed_by = 'ana', status_reason = ${reason} where id = ${id}`;
    }
  });

  test("the old btrim() CHECK is gone; the new one is validated", async () => {
    const rows = await pg.sql<{ conname: string; convalidated: boolean }[]>`
      select conname, convalidated from pg_constraint
      where conrelid = 'core.dead_letters'::regclass and conname like 'dead_letters_discard%'`;
    expect(rows).toEqual([{ conname: "dead_letters_discard_reason_not_blank", convalidated: true }]);
  });
});
