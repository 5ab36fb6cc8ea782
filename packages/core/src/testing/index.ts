/**
 * `@softcrum/core/testing`: what a module's tests need.
 * - Test databases on a real Postgres: a template migrated once per run
 *   (core's migrations and the module's), a copy per test file, kept with
 *   its name printed when the file failed (`moduleGlobalSetup`,
 *   `useModuleDatabase` for Vitest; the functions of `postgres.ts` for
 *   other runners).
 * - Jobs run through bound consumers on a manual clock (`createTestQueue`,
 *   `deliver`): a whole retry schedule in no real time.
 * - Assertions on what jobs left (`expectOneEffect`, `deadLettersOf`,
 *   `fenceOf`), throwing node:assert's AssertionError.
 *
 * Needs `postgres` (postgres.js); Vitest only for `useModuleDatabase`.
 */
export { createManualClock, type ManualClock } from "../clock.ts";
export type { JobDeadLetter, JobFence, RowFilter } from "./assertions.ts";
export { deadLettersOf, expectOneEffect, fenceOf } from "./assertions.ts";
export type { CreatedDatabase, PostgresServer, TaskLike, TemplateDatabase, TemplateMigrations } from "./postgres.ts";
export {
  anyTaskFailed,
  createDatabaseFrom,
  createTemplateDatabase,
  dropDatabase,
  findTestPostgres,
  finishDatabase,
  keptDatabaseMessage,
  LOCAL_TEST_DATABASE_URL,
  noPostgresMessage,
  reachPostgres,
  redactUrl,
  shouldKeepDatabase,
  uniqueDatabaseName,
  withAdmin,
  withDatabase,
} from "./postgres.ts";
export type { DrainReport, TestDelivery, TestPublishOptions, TestQueue, TestQueueOptions } from "./queue.ts";
export { createTestQueue, DEFAULT_DRAIN_MAX_MS, deliver } from "./queue.ts";
export type {
  Connection,
  ModuleGlobalSetupOptions,
  ProvidedPostgres,
  ProvidingProject,
  TestDatabase,
} from "./vitest.ts";
export { moduleGlobalSetup, PROVIDED_KEY, useModuleDatabase } from "./vitest.ts";
