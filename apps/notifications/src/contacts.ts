/** A tenant's contacts in our own store (never the provider's audiences, SPEC §7). */
import type { AnyPgDatabase } from "@softcrum/core";
import { and, eq, sql } from "drizzle-orm";
import { z } from "zod";
import { InvalidContactError, issuesOf } from "./errors.ts";
import { contacts } from "./schema.ts";

const contactInput = z.object({ email: z.email().max(320), name: z.string().max(200).optional() });
export type ContactInput = z.infer<typeof contactInput>;

/** Rows per INSERT: a large import is written in bounded statements. */
const WRITE_PAGE = 1_000;

/**
 * Adds contacts to a tenant (an address already there keeps its row, its
 * name updated, and its subscription as it was). Addresses are lowercased:
 * one person is one contact. Returns how many addresses were written.
 */
export async function addContacts(
  db: AnyPgDatabase,
  tenantId: string,
  input: readonly ContactInput[],
): Promise<number> {
  const parsed = z.array(contactInput).safeParse(input);
  if (!parsed.success) throw new InvalidContactError(issuesOf(parsed.error));
  // One row per address (the last one given wins): Postgres refuses an upsert that touches a row twice.
  const byEmail = new Map(parsed.data.map((c) => [c.email.toLowerCase(), c.name ?? null]));
  const rows = [...byEmail].map(([email, name]) => ({ tenantId, email, name }));
  let written = 0;
  for (let start = 0; start < rows.length; start += WRITE_PAGE) {
    const page = rows.slice(start, start + WRITE_PAGE);
    await db
      .insert(contacts)
      .values(page)
      .onConflictDoUpdate({ target: [contacts.tenantId, contacts.email], set: { name: sql`excluded.name` } });
    written += page.length;
  }
  return written;
}

/** Leaves the contact out of blasts started from now on (a blast already started keeps its snapshot). */
export async function unsubscribeContact(db: AnyPgDatabase, tenantId: string, email: string): Promise<void> {
  await db
    .update(contacts)
    .set({ unsubscribedAt: sql`coalesce(${contacts.unsubscribedAt}, now())` })
    .where(and(eq(contacts.tenantId, tenantId), eq(contacts.email, email.toLowerCase())));
}
