/**
 * A module's migrations as one deploy step: the core's, then the module's,
 * on one connection that holds the migration lock for the whole run (no
 * other run, of this module or another, interleaves). Services never
 * migrate at start; they check (`assertMigrated`, which `createModule` does).
 *
 * A module's `db:migrate` script is one line:
 *   await runModuleMigrationsCli("loyalty", loyaltyMigrations);
 */
import {
  coreMigrations,
  MIGRATION_LOCK_KEY,
  type MigrateOptions,
  type MigrateReport,
  type MigrationSession,
  type MigrationSet,
  migrate,
  postgresJsSession,
  runMigrationsCli,
} from "../db/migrate.ts";
import { InvalidConfigError } from "../errors.ts";

/** A module's migration folders: one set, or several applied in order. */
export type ModuleMigrations = MigrationSet | readonly MigrationSet[];

export interface MigrateModuleOptions extends MigrateOptions {
  /** Names the module's tags in `applied` (`loyalty/0003_…`). @default "module" */
  readonly label?: string;
}

export interface ModuleMigrateReport extends MigrateReport {
  /** Every tag this run applied, the core's first: `core/<tag>`, then `<label>/<tag>`. */
  readonly applied: string[];
  /** Tags of the core's migrations this run applied. */
  readonly core: readonly string[];
  /** Tags of the module's migrations this run applied, its sets in order. */
  readonly module: readonly string[];
}

/**
 * The migration sets a module's database holds, the core's first, each once;
 * refuses two sets that would share one bookkeeping table (one would read the
 * other's history as its own).
 */
export function migrationSetsOf(module: string, migrations: ModuleMigrations | undefined): MigrationSet[] {
  const given = migrations === undefined ? [] : isSet(migrations) ? [migrations] : [...migrations];
  const sets: MigrationSet[] = [coreMigrations];
  for (const set of given) {
    if (!isSet(set)) {
      throw new InvalidConfigError(
        `module ${JSON.stringify(module)}: migrations must be migration sets ({ migrationsFolder, migrationsSchema, migrationsTable })`,
      );
    }
    const same = sets.find(
      (s) => s.migrationsSchema === set.migrationsSchema && s.migrationsTable === set.migrationsTable,
    );
    if (same?.migrationsFolder === set.migrationsFolder) continue;
    if (same) {
      throw new InvalidConfigError(
        `module ${JSON.stringify(module)}: the migrations of ${set.migrationsFolder} and ${same.migrationsFolder} share the bookkeeping table ${set.migrationsSchema}.${set.migrationsTable}; give each folder its own`,
      );
    }
    sets.push(set);
  }
  return sets;
}

/**
 * Applies the core's migrations, then the module's, to `databaseUrl`, under
 * the migration lock held for the whole run. Idempotent; safe to run from
 * several processes at once (the others wait, then find nothing to do).
 */
export async function migrateModule(
  databaseUrl: string,
  migrations: ModuleMigrations,
  options: MigrateModuleOptions = {},
): Promise<ModuleMigrateReport> {
  const label = options.label ?? "module";
  const sets = migrationSetsOf(label, migrations);
  const { default: postgres } = await import("postgres");
  // One connection: the session advisory lock belongs to it.
  const client = postgres(databaseUrl, { max: 1, onnotice: () => {} });
  const session = postgresJsSession(client);
  const lock = options.lock ?? true;
  try {
    if (lock) await acquireLock(session, options.lockPollMs ?? 250);
    try {
      const core: string[] = [];
      const module: string[] = [];
      for (const set of sets) {
        // The lock is held already: each set runs inside it.
        const { applied } = await migrate(session, set, { ...options, lock: false });
        (set === coreMigrations ? core : module).push(...applied);
      }
      return {
        applied: [...core.map((tag) => `core/${tag}`), ...module.map((tag) => `${label}/${tag}`)],
        core,
        module,
      };
    } finally {
      if (lock) await session.run(`SELECT pg_advisory_unlock(${MIGRATION_LOCK_KEY})`).catch(() => {});
    }
  } finally {
    await client.end({ timeout: 5 });
  }
}

/**
 * The body of a module's `db:migrate` script: `migrateModule` on
 * $DATABASE_URL, says what it applied, sets the exit code (2 without
 * DATABASE_URL, 1 when a migration fails).
 */
export function runModuleMigrationsCli(
  label: string,
  migrations: ModuleMigrations,
  options: MigrateOptions = {},
): Promise<void> {
  return runMigrationsCli(label, (url) => migrateModule(url, migrations, { ...options, label }));
}

/**
 * Waits for the migration lock with try-lock between short statements, never
 * blocked inside one (a session blocked in pg_advisory_lock() holds a
 * snapshot that the lock holder's CREATE INDEX CONCURRENTLY waits for: ADR 0008).
 */
async function acquireLock(session: MigrationSession, pollMs: number): Promise<void> {
  for (;;) {
    const [row] = await session.run(`SELECT pg_try_advisory_lock(${MIGRATION_LOCK_KEY}) AS "locked"`);
    if (row?.["locked"] === true) return;
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}

function isSet(value: unknown): value is MigrationSet {
  const set = value as Partial<MigrationSet> | null;
  return (
    typeof set === "object" &&
    set !== null &&
    typeof set.migrationsFolder === "string" &&
    typeof set.migrationsSchema === "string" &&
    typeof set.migrationsTable === "string"
  );
}
