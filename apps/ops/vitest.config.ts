import { configDefaults, defineProject } from "vitest/config";

/**
 * The slow files: they run `pnpm ops` end to end, one CLI process per
 * command. Project `ops-cli:faults`, run by `pnpm test:faults` (CI runs it
 * after `pnpm test`); the `ops-cli` project leaves them out.
 */
const FAULT_FILES = ["test/cli.test.ts", "test/cli-routing.test.ts", "test/runbook.test.ts"];

const shared = {
  globalSetup: ["./test/global-setup.ts"],
  testTimeout: 120_000,
  hookTimeout: 60_000,
};

export const faults = defineProject({
  test: { name: "ops-cli:faults", include: FAULT_FILES, ...shared },
});

export default defineProject({
  test: {
    name: "ops-cli",
    include: ["test/**/*.test.ts"],
    exclude: [...configDefaults.exclude, ...FAULT_FILES],
    ...shared,
  },
});
