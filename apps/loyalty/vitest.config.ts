import { configDefaults, defineProject } from "vitest/config";

/**
 * The slow files: they start the worker as a process of its own. Project
 * `loyalty:faults`, run by `pnpm test:faults` (CI runs it after `pnpm test`);
 * the `loyalty` project leaves them out.
 */
const FAULT_FILES = ["src/worker.test.ts", "src/worker-alerts.test.ts"];

const shared = {
  globalSetup: ["./test/global-setup.ts"],
  testTimeout: 60_000,
  hookTimeout: 60_000,
};

export const faults = defineProject({
  test: { name: "loyalty:faults", include: FAULT_FILES, ...shared },
});

export default defineProject({
  test: {
    name: "loyalty",
    include: ["src/**/*.test.ts"],
    exclude: [...configDefaults.exclude, ...FAULT_FILES],
    ...shared,
  },
});
