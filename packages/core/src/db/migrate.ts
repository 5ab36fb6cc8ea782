import { fileURLToPath } from "node:url";

/**
 * The folder of @softcrum/core's generated SQL migrations (the repository's
 * top-level `drizzle/`), for drizzle-orm's migrator of whichever driver the
 * module uses: `migrate(db, { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable })`.
 */
export const coreMigrationsFolder = fileURLToPath(new URL("../../../../drizzle", import.meta.url));

/** Drizzle's bookkeeping table for the core migrations (kept apart from each module's own). */
export const coreMigrationsTable = { migrationsSchema: "drizzle", migrationsTable: "__softcrum_core_migrations" };

export interface MigrationSet {
  readonly migrationsFolder: string;
  readonly migrationsSchema: string;
  readonly migrationsTable: string;
}

/** Applies one folder of Drizzle migrations to a Postgres database through postgres.js. Idempotent. */
export async function migratePostgres(databaseUrl: string, set: MigrationSet): Promise<void> {
  const { default: postgres } = await import("postgres");
  const { drizzle } = await import("drizzle-orm/postgres-js");
  const { migrate } = await import("drizzle-orm/postgres-js/migrator");
  const client = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  try {
    await migrate(drizzle({ client }), set);
  } finally {
    await client.end();
  }
}

/** Applies the core migrations. */
export function migrateCore(databaseUrl: string): Promise<void> {
  return migratePostgres(databaseUrl, { migrationsFolder: coreMigrationsFolder, ...coreMigrationsTable });
}

/** The body of a `pnpm db:migrate` script: migrates $DATABASE_URL, says what happened, sets the exit code. */
export async function runMigrationsCli(label: string, migrate: (databaseUrl: string) => Promise<void>): Promise<void> {
  const url = process.env["DATABASE_URL"];
  if (!url) {
    console.error(
      "DATABASE_URL is not set; e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres pnpm db:migrate",
    );
    process.exitCode = 2;
    return;
  }
  try {
    await migrate(url);
    console.log(`${label} migrations applied`);
  } catch (error) {
    console.error(`${label} migrations failed: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  }
}
