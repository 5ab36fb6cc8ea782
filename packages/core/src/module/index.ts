// `@softcrum/core/module`: a module's composition root in a few lines
// (`createModule`), its transport choice (`fromEnv`, `memory`, `vercel`), and
// its migrations as one deploy step (`migrateModule`, `runModuleMigrationsCli`).
// Files by role: transport.ts (the transport choice; the Vercel adapter is
// imported only when opened), database.ts (URL, Drizzle database or PGlite),
// migrations.ts (the deploy step), module.ts (`createModule`), errors.ts.

export type { DatabaseKind, ModuleDatabaseOption } from "./database.ts";
export { DEFAULT_POOL_SIZE } from "./database.ts";
export { DuplicateConsumerError, UnknownConsumerError } from "./errors.ts";
export type { MigrateModuleOptions, ModuleMigrateReport, ModuleMigrations } from "./migrations.ts";
export { migrateModule, migrationSetsOf, runModuleMigrationsCli } from "./migrations.ts";
export type {
  InProcessModule,
  Module,
  ModuleFor,
  ModuleOptions,
  OutboxOption,
  OutboxSettings,
  PushRoute,
  RouteSetting,
  VercelModule,
} from "./module.ts";
export { buildVersion, createModule } from "./module.ts";
export type { FromEnvOptions, MemoryTransport, Transport, VercelTransport } from "./transport.ts";
export { fromEnv, memory, TRANSPORT_ENV, vercel } from "./transport.ts";
