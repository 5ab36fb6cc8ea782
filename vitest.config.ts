import { defineConfig } from "vitest/config";
import projects from "./vitest.workspace.ts";

export default defineConfig({
  test: {
    projects,
    // Vitest's report, then the one line per failure that matters (or one line: all passed).
    reporters: ["default", "./packages/testing/src/summary-reporter.ts"],
  },
});
