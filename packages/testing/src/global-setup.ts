import type { TestProject } from "vitest/node";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "./postgres.ts";

/** What global setup hands to every test file (through Vitest's provide/inject). */
export interface ProvidedPostgres {
  readonly adminUrl: string;
  readonly template: string;
}
export const PROVIDED_KEY = "softcrumPostgres";

/**
 * A Vitest global setup: finds Postgres, creates a template database and runs
 * `migrate` on it once; every test file then copies it (see useTestDatabase).
 */
export function createPostgresGlobalSetup(label: string, migrate: (databaseUrl: string) => Promise<unknown>) {
  return async function setup(project: TestProject) {
    const server = await findPostgres();
    const template = uniqueDatabaseName("softcrum_tpl", label);
    await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(template)}`);
    await migrate(withDatabase(server.adminUrl, template));
    const provided: ProvidedPostgres = { adminUrl: server.adminUrl, template };
    // Untyped on purpose: a module augmentation of "vitest" breaks when pnpm
    // installs several peer variants of it in one workspace.
    (project.provide as (key: string, value: unknown) => void)(PROVIDED_KEY, provided);
    return async () => {
      await withAdmin(server.adminUrl, (sql) => sql`drop database if exists ${sql(template)} with (force)`);
      await server.stop();
    };
  };
}
