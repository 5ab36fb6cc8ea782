import { moduleGlobalSetup, type ProvidingProject } from "../../core/src/testing/vitest.ts";
import { findPostgres } from "./postgres.ts";

export type { ProvidedPostgres } from "../../core/src/testing/vitest.ts";
export { PROVIDED_KEY } from "../../core/src/testing/vitest.ts";

/**
 * A Vitest global setup: finds Postgres (testcontainers as the last resort),
 * creates a template database and runs `migrate` on it once; every test file
 * then copies it (see useTestDatabase). It is `moduleGlobalSetup` of
 * `@softcrum/core/testing` with the migration as one function.
 */
export function createPostgresGlobalSetup(
  label: string,
  migrate: (databaseUrl: string) => Promise<unknown>,
): (project: ProvidingProject) => Promise<() => Promise<void>> {
  return moduleGlobalSetup({ name: label, migrate, includeCore: false, findServer: findPostgres });
}
