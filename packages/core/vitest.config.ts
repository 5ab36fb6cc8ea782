import { configDefaults, defineProject } from "vitest/config";

/**
 * The slow files: fault injection, driver matrices, scale, races on the real
 * clock, and tests that start processes or clusters of their own. Project
 * `core:faults`, run by `pnpm test:faults` (CI runs it after `pnpm test`);
 * the `core` project leaves them out. Globs: a file that does not exist (yet)
 * matches nothing.
 */
const FAULT_FILES = [
  "src/db/engine.contract.test.ts", // every driver × isolation level, lock waits and timeouts against other sessions
  "src/db/batch.contract.test.ts", // batched work transactions: the same matrix, lock waits, deadlocks and timeouts
  "src/db/commit-inside.contract.test.ts", // what runs inside COMMIT (deferred triggers, holdable cursors): the same matrix
  "src/db/batch.faults.test.ts", // a gate bypass, budgets spent behind slow statements, late COMMITs
  "src/db/prepared-query.test.ts", // every driver, a PGlite booted and migrated
  "src/db/transport-holds.test.ts", // every driver, one PGlite booted and migrated per case
  "src/harness-faults.test.ts",
  "src/adapters/vercel/answer-matrix.test.ts", // every platform answer on every republishing path, timeouts included
  "src/ops/ops-replay-scale.test.ts",
  "src/ops/ops-replay.test.ts", // replays raced against live deliveries and each other: 37 cases, ~24 s
  "src/ops/ops-scale.test.ts", // 200,000 dead letters
  "src/ops/batch-controls.test.ts", // controls landing while a paced runner waits, on the real clock
  "src/limits/upstash.test.ts", // three worker processes against one Redis bucket
  "src/alerts/betterstack/betterstack.test.ts", // a fleet of alerting worker processes against one ingest server
  "src/lanes/upstash.test.ts", // another process fills and drains the backlog
  "test/connection-faults.test.ts", // a cluster of its own, restarted under a worker process
  "test/database-down.test.ts", // a cluster of its own, stopped while a letter is due
  "test/server-crash.test.ts", // a cluster of its own, crashed right after the acknowledgements
  "test/processes.test.ts",
  "test/pooler.test.ts", // a PgBouncer of its own
  "test/package-install.test.ts", // packs the package and npm-installs it into a scratch project
  "test/new-module.test.ts", // scaffolds a module in a copy of the repository: pnpm install, tsc, its tests
  "test/guide.test.ts", // the guide's module in a scratch project: tsc, migrations, its tests
];

const shared = {
  globalSetup: ["./test/global-setup.ts"],
  testTimeout: 30_000,
  hookTimeout: 60_000,
};

// The type tests (src/**/*.test-d.ts) run here too: Vitest typechecks the
// whole project for them (~18 s), and `pnpm typecheck` checks the same files.
export const faults = defineProject({
  test: {
    name: "core:faults",
    include: FAULT_FILES,
    ...shared,
    typecheck: { enabled: true, include: ["src/**/*.test-d.ts"], tsconfig: "./tsconfig.json" },
  },
});

export default defineProject({
  test: {
    name: "core",
    include: ["src/**/*.test.ts", "test/**/*.test.ts"],
    exclude: [...configDefaults.exclude, ...FAULT_FILES],
    ...shared,
  },
});
