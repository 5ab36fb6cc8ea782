/**
 * A 1,050-recipient blast through the whole module (#20 item 4): the
 * harness on real Postgres, the real Resend SDK against the fake Resend
 * server on loopback, every chunk job published twice (the blast started
 * twice at once), and a 429 storm — the first calls refused, then a seeded
 * 30% of all calls — each 429 with a Retry-After. Reports:
 * - `blast_batch_calls`: batch requests Resend accepted (goal: 11, one per chunk);
 * - `blast_429s`: requests answered 429 (deferred, never an attempt);
 * - `blast_emails_sent`: e-mails accepted (goal: 1,050);
 * - `blast_duplicate_emails`: e-mails beyond the first to one recipient (goal: 0).
 * Time is the module's manual clock (deferrals, Retry-After and the rate
 * limiter's waits are moved through, not slept): this counts what was sent,
 * it does not time it. Exits 1 when a goal is missed. The last line printed
 * is JSON.
 *
 *   pnpm --filter @softcrum/example-notifications bench:blast
 */
import { createManualClock } from "@softcrum/core";
import { migrateCore } from "@softcrum/core/migrate";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing/postgres";
import postgres from "postgres";
import { uuidv7 } from "uuidv7";
import { createNotificationsModule } from "../src/composition-root.ts";
import { addContacts } from "../src/contacts.ts";
import { migrateNotifications } from "../src/migrations.ts";
import { startFakeResend } from "../test/fake-resend.ts";

const RECIPIENTS = 1_050;
const CHUNKS = Math.ceil(RECIPIENTS / 100);

const server = await findPostgres();
const database = uniqueDatabaseName("softcrum_bench", "blast");
await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(database)}`);
const url = withDatabase(server.adminUrl, database);
const fake = await startFakeResend();
let result: Record<string, number> | undefined;
try {
  await migrateCore(url);
  await migrateNotifications(url);
  process.env["RESEND_BASE_URL"] = fake.url;
  const module = await createNotificationsModule({
    databaseUrl: url,
    resendApiKey: fake.apiKey,
    clock: createManualClock(),
    logger: { warn: () => {}, error: () => {} },
  });
  try {
    await addContacts(
      module.db,
      "acme",
      Array.from({ length: RECIPIENTS }, (_, i) => ({ email: `reader-${String(i).padStart(5, "0")}@example.com` })),
    );
    fake.rateLimitNext(4, 2);
    fake.rateLimitFraction(0.3, { seed: 20, retryAfterSeconds: 1 });
    const input = {
      blastId: uuidv7(),
      tenantId: "acme",
      message: { from: "Acme News <news@acme.example>", subject: "Winter sale", html: "<p>Half off.</p>" },
    };
    const outcomes = new Map<string, number>();
    module.queue.onDelivery((event) =>
      outcomes.set(event.result.outcome, (outcomes.get(event.result.outcome) ?? 0) + 1),
    );
    const reports = await Promise.all([module.startBlast(input), module.startBlast(input)]);
    await module.settle();
    const perRecipient = fake.emailsPerRecipient();
    const duplicates = [...perRecipient.values()].reduce((sum, n) => sum + Math.max(0, n - 1), 0);
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    const [letters] = await sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
    await sql.end();
    console.log(
      `chunk jobs published: ${reports.map((r) => r.published).join(" + ")}; deliveries: ${JSON.stringify(Object.fromEntries(outcomes))}; recipients reached: ${perRecipient.size}; dead letters: ${letters?.n}`,
    );
    result = {
      blast_recipients: RECIPIENTS,
      blast_batch_calls: fake.count("accepted", "/emails/batch"),
      blast_429s: fake.count("rate_limited"),
      blast_emails_sent: fake.emails.length,
      blast_duplicate_emails: duplicates,
    };
  } finally {
    await module.close();
  }
} finally {
  await fake.close();
  await withAdmin(server.adminUrl, (sql) => sql`drop database if exists ${sql(database)} with (force)`);
  await server.stop();
}
if (
  result === undefined ||
  result["blast_batch_calls"] !== CHUNKS ||
  result["blast_emails_sent"] !== RECIPIENTS ||
  result["blast_duplicate_emails"] !== 0
) {
  process.exitCode = 1;
}
console.log(JSON.stringify(result ?? {}));
