import { defineProject } from "vitest/config";

export default defineProject({
  test: {
    name: "ops-cli",
    include: ["test/**/*.test.ts"],
    globalSetup: ["./test/global-setup.ts"],
    testTimeout: 120_000,
    hookTimeout: 60_000,
  },
});
