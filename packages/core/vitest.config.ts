import { defineProject } from "vitest/config";

export default defineProject({
  test: {
    name: "core",
    include: ["src/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["./test/global-setup.ts"],
    testTimeout: 30_000,
    // Under CI only, a failed test runs once more. A stopgap, not a cure: three
    // concurrency tests still fail about one full run in three on the 2-core
    // machine (award-points "a partner outage…", ops-replay "two direct
    // replays of one operator at once…", betterstack "independent adapters on
    // their own pools racing…"); they are open defects (issue #10), and a
    // retry that passes is still printed as flaky in the report.
    retry: process.env["CI"] ? 1 : 0,
    hookTimeout: 60_000,
    typecheck: { enabled: true, include: ["src/**/*.test-d.ts"], tsconfig: "./tsconfig.json" },
  },
});
