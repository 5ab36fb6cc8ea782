import { defineProject } from "vitest/config";

export default defineProject({
  test: {
    name: "notifications",
    include: ["src/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["./test/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
