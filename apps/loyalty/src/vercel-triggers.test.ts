import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { InvalidConfigError } from "@softcrum/core";
import { describe, expect, test } from "vitest";
import { createAwardPointsConsumer, createNotifyPartnerConsumer } from "./award-points.ts";
import { LOYALTY_POOL_SIZE, loyaltyTriggers, loyaltyVercelJson } from "./vercel-triggers.ts";

describe("vercel.json trigger blocks (#11 item 1)", () => {
  test("apps/loyalty/vercel.json is what the consumer definitions produce (pnpm --filter @softcrum/example-loyalty vercel:json)", () => {
    const file = readFileSync(fileURLToPath(new URL("../vercel.json", import.meta.url)), "utf8");
    expect(file).toBe(`${JSON.stringify(loyaltyVercelJson(), null, 2)}\n`);
  });

  test("every trigger names its cap, its retry delay and a concurrency within the database pool", () => {
    const { functions } = loyaltyVercelJson();
    const triggers = Object.values(functions).map((f) => f.experimentalTriggers[0]);
    expect(triggers.map((t) => t.topic).sort()).toEqual([
      "loyalty_Dpartner-notifications",
      "loyalty_Dpoints",
      "loyalty_Drecurring",
    ]);
    for (const trigger of triggers) {
      expect(trigger.maxDeliveries).toBeGreaterThanOrEqual(5 + 2);
      expect(trigger.retryAfterSeconds).toBeGreaterThan(0);
    }
    expect(triggers.reduce((sum, t) => sum + t.maxConcurrency, 0)).toBeLessThanOrEqual(LOYALTY_POOL_SIZE);
  });

  test("a retry budget the trigger's cap could not hold is refused when the triggers are built", () => {
    const notifier = { pointsAwarded: async () => {} };
    expect(() =>
      loyaltyTriggers({
        awardPoints: createAwardPointsConsumer({ retry: { maxAttempts: 11 } }),
        notifyPartner: createNotifyPartnerConsumer({ notifier }),
      }),
    ).toThrow(InvalidConfigError);
  });
});
