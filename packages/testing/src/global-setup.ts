import type { TestProject } from "vitest/node";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "./postgres.ts";

declare module "vitest" {
  export interface ProvidedContext {
    softcrumPostgres: { adminUrl: string; template: string };
  }
}

/**
 * A Vitest global setup: finds Postgres, creates a template database and runs
 * `migrate` on it once; every test file then copies it (see useTestDatabase).
 */
export function createPostgresGlobalSetup(label: string, migrate: (databaseUrl: string) => Promise<void>) {
  return async function setup(project: TestProject) {
    const server = await findPostgres();
    const template = uniqueDatabaseName("softcrum_tpl", label);
    await withAdmin(server.adminUrl, (sql) => sql`create database ${sql(template)}`);
    await migrate(withDatabase(server.adminUrl, template));
    project.provide("softcrumPostgres", { adminUrl: server.adminUrl, template });
    return async () => {
      await withAdmin(server.adminUrl, (sql) => sql`drop database if exists ${sql(template)} with (force)`);
      await server.stop();
    };
  };
}
