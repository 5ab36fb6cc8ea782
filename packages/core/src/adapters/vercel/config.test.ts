import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, test } from "vitest";
import { TEST_QUEUE_SECRET } from "../../../test/fake-vercel-queues.ts";
import { InvalidConfigError } from "../../errors.ts";
import { resolveVercelQueueConfig } from "./config.ts";
import { createVercelQueue } from "./queue.ts";

describe("configuration", () => {
  test("missing region, credentials and deployment id are one clear error when the adapter is created", () => {
    let error: unknown;
    try {
      createVercelQueue({ env: {} });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidConfigError);
    const message = (error as Error).message;
    expect(message).toMatch(/region: pass options.region or set VERCEL_REGION/);
    expect(message).toMatch(/credentials: pass options.token, set VERCEL_OIDC_TOKEN/);
    expect(message).toMatch(/deployment: set VERCEL_DEPLOYMENT_ID/);
    expect(message).toMatch(
      /wrapperSecret: pass options.wrapperSecret or set SOFTCRUM_QUEUE_SECRET, at least 32 characters/,
    );
    expect(() =>
      createVercelQueue({ env: {}, region: "iad1", token: "t", deploymentId: null, wrapperSecret: "too short" }),
    ).toThrow(/wrapperSecret/);
    expect(() =>
      createVercelQueue({
        env: { VERCEL_REGION: "iad1", VERCEL_DEPLOYMENT_ID: "dpl_1", SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET },
      }),
    ).toThrow(/credentials/);
  });

  test("reads the region, OIDC token and deployment id from the environment Vercel sets", () => {
    const env = {
      VERCEL_REGION: "fra1",
      VERCEL_OIDC_TOKEN: "eyJ…",
      VERCEL_DEPLOYMENT_ID: "dpl_123",
      SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET,
    };
    expect(createVercelQueue({ env }).region).toBe("fra1");
    // Inside a Vercel Function the OIDC token comes with each request, not from the environment.
    expect(
      createVercelQueue({
        env: {
          VERCEL: "1",
          VERCEL_REGION: "iad1",
          VERCEL_DEPLOYMENT_ID: "d",
          SOFTCRUM_QUEUE_SECRET: TEST_QUEUE_SECRET,
        },
      }).region,
    ).toBe("iad1");
    expect(
      createVercelQueue({ env: {}, region: "sfo1", token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET })
        .region,
    ).toBe("sfo1");
  });

  test("an invalid region or lease length is refused", () => {
    const base = { env: {}, token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET };
    expect(() => createVercelQueue({ ...base, region: "US East" })).toThrow(/not a Vercel region code/);
    expect(() => createVercelQueue({ ...base, region: "iad1", visibilityTimeoutSeconds: 5 })).toThrow(
      /visibilityTimeoutSeconds/,
    );
    expect(() => createVercelQueue({ ...base, region: "iad1", retentionSeconds: 700_000 })).toThrow(/retentionSeconds/);
  });

  test("importing @softcrum/core does not load @vercel/queue", () => {
    // Walk the static import graph of the core's entry point.
    const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../index.ts");
    const seen = new Set<string>();
    const bare = new Set<string>();
    const visit = (file: string) => {
      if (seen.has(file)) return;
      seen.add(file);
      const source = readFileSync(file, "utf8");
      for (const [, spec] of source.matchAll(
        /(?:import|export)[^'"]*?from\s+["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g,
      )) {
        if (!spec) continue;
        if (spec.startsWith(".")) visit(resolve(dirname(file), spec));
        else bare.add(spec);
      }
    };
    visit(root);
    expect(seen.size).toBeGreaterThan(5);
    expect([...bare].filter((s) => s.startsWith("@vercel/"))).toEqual([]);
    expect([...seen].some((f) => f.includes("adapters/vercel"))).toBe(false);
  });

  test("a configuration resolved once is taken as it is; one resolveVercelQueueConfig did not return is refused", async () => {
    const options = { env: {}, region: "sfo1", token: "t", deploymentId: null, wrapperSecret: TEST_QUEUE_SECRET };
    const config = resolveVercelQueueConfig({ ...options, retentionSeconds: 86_400 });
    expect(config.transportHoldMs).toBe(86_400_000);
    expect(Object.isFrozen(config)).toBe(true);
    // Not read again: the settings beside it are the ones it was resolved from.
    const queue = createVercelQueue({ ...options, config });
    expect([queue.region, queue.transportHoldMs]).toEqual(["sfo1", 86_400_000]);
    await queue.close();
    expect(() => createVercelQueue({ ...options, config: { ...config } })).toThrow(
      /options.config: pass what resolveVercelQueueConfig returned/,
    );
  });
});
