import { defineProject } from "vitest/config";

/**
 * Project `bench-peers:faults`: the smoke run of `pnpm bench:peers` (every
 * system, PEERS_N=500, one round, in a process of its own; ~1 minute). This
 * package has no fast tests, so its one project is its default export, named
 * `*:faults`: `pnpm test:faults` selects it and `pnpm test` leaves it out
 * (root vitest.workspace.ts finds the projects). Here, `npx vitest run` runs it.
 */
export default defineProject({
  test: {
    name: "bench-peers:faults",
    include: ["test/**/*.test.ts"],
    testTimeout: 180_000,
    hookTimeout: 60_000,
  },
});
