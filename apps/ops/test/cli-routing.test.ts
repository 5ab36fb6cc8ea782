/**
 * #10 items 1 and 5: the CLI publishes replays through the platform transport
 * its composition root configures, for the routes the modules registered; a
 * letter it cannot route is refused (exit 4), audited, and stays pending.
 */
import { fileURLToPath } from "node:url";
import { createEnvelope } from "@softcrum/core";
import { createLoyaltyModule } from "@softcrum/example-loyalty/composition-root";
import { runScript, useTestDatabase } from "@softcrum/testing";
import { beforeAll, describe, expect, test } from "vitest";
import { openReplayTransport } from "../src/composition.ts";

const pg = useTestDatabase("ops-cli-routing");
const CLI = fileURLToPath(new URL("../src/cli.ts", import.meta.url));

function ops(args: string[], env: Record<string, string> = {}) {
  return runScript(CLI, args, {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    env: { DATABASE_URL: pg.url, SOFTCRUM_OPERATOR: "", ...env },
  });
}

let loyaltyLetter: string;
const foreignLetter = "0190b3c4-0000-7000-8000-00000000abcd";

beforeAll(async () => {
  // One loyalty letter (a closed customer) and one of a module the CLI does not know.
  const module = await createLoyaltyModule({
    databaseUrl: pg.url,
    transport: "memory",
    notifier: { pointsAwarded: async () => {} },
    closedCustomers: new Set(["c-closed"]),
    logger: { warn: () => {}, error: () => {} },
  });
  await module.queue.publish(
    "loyalty.points",
    createEnvelope({
      tenantId: "acme",
      kind: "points.award.v1",
      data: { customerId: "c-closed", points: 5, reason: "purchase" },
    }),
  );
  await module.settle();
  await module.close();
  const [row] = await pg.sql<{ id: string }[]>`select id from core.dead_letters`;
  loyaltyLetter = row?.id as string;
  const envelope = createEnvelope({ tenantId: "acme", kind: "invoice.send.v1", data: { invoice: 7 } });
  await pg.sql`insert into core.dead_letters (id, job_id, queue, consumer, payload, attempts, last_error, error_class)
    values (${foreignLetter}, ${envelope.job_id}, 'billing.invoices', 'billing.send', ${JSON.stringify(envelope)}, 5, 'e', 'exhausted')`;
});

const statusOf = async (id: string) =>
  (await pg.sql<{ status: string }[]>`select status from core.dead_letters where id = ${id}`)[0]?.status;

describe("pnpm ops replays only what reaches a consumer (#10 items 1, 5)", () => {
  test("in-process: a letter of a module whose consumers do not run here is refused (exit 4), audited, and stays pending", async () => {
    const result = await ops(["dlq", "replay", foreignLetter, "--reason", "partner fixed", "--json"]);
    expect(result.code, result.stderr).toBe(4);
    const report = JSON.parse(result.stdout);
    expect(report.results).toEqual([
      expect.objectContaining({
        id: foreignLetter,
        outcome: "not_routable",
        detail: expect.stringMatching(/in-process/),
      }),
    ]);
    expect(await statusOf(foreignLetter)).toBe("pending_review");
    // Under the database role the CLI logged in as.
    const audit = await pg.sql`select action, result from core.ops_audit where scope -> 'ids' ? ${foreignLetter}`;
    expect(audit).toEqual([{ action: "dead_letter.replay", result: "refused" }]);
  });

  test("a registered module's letter replays through its in-process consumers; replaying it again is refused (exit 4, not 5)", async () => {
    const first = await ops(["dlq", "replay", loyaltyLetter, "--reason", "account reopened", "--json"]);
    expect(first.code, first.stderr).toBe(0);
    expect(JSON.parse(first.stdout).counts).toEqual({ replayed: 1 });
    expect(await statusOf(loyaltyLetter)).toBe("replayed");
    const again = await ops(["dlq", "replay", loyaltyLetter, "--reason", "again", "--json"]);
    expect(again.code, again.stderr).toBe(4);
    expect(JSON.parse(again.stdout).results[0]).toMatchObject({
      outcome: "not_pending",
      detail: expect.stringMatching(/^status is replayed, by .+: nothing to do$/),
    });
    const audit = await pg.sql`select result from core.ops_audit where scope -> 'ids' ? ${loyaltyLetter} order by id`;
    expect(audit).toEqual([{ result: "ok" }, { result: "refused" }]);
  });

  test("SOFTCRUM_QUEUE=vercel: the registry routes the modules' consumers and refuses any other letter (exit 4), which stays pending", async () => {
    const vercel = {
      SOFTCRUM_QUEUE: "vercel",
      VERCEL_REGION: "iad1",
      VERCEL_OIDC_TOKEN: "token-for-the-test",
      VERCEL_DEPLOYMENT_ID: "dpl_test",
      SOFTCRUM_QUEUE_SECRET: "a-queue-secret-of-at-least-32-characters",
    };
    const composed = await openReplayTransport({ databaseUrl: pg.url }, vercel);
    try {
      expect(composed.transport).toBe("vercel");
      expect(composed.replay.route("loyalty.points", "loyalty.award-points")).toEqual({ ok: true });
      expect(composed.replay.route("loyalty.partner-notifications", "loyalty.notify-partner")).toEqual({ ok: true });
      expect(composed.replay.route("billing.invoices", "billing.send")).toMatchObject({ ok: false });
    } finally {
      await composed.close();
    }
    const result = await ops(["dlq", "replay", foreignLetter, "--reason", "x", "--json"], vercel);
    expect(result.code, result.stderr).toBe(4);
    expect(JSON.parse(result.stdout).results[0]).toMatchObject({
      outcome: "not_routable",
      detail: expect.stringMatching(/no module registered this queue and consumer with Vercel Queues/),
    });
    expect(await statusOf(foreignLetter)).toBe("pending_review");
  });
});
