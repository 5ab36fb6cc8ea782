// #22 item 5: `pnpm new:module <name>` (scripts/new-module.mjs), end to end
// on a copy of the repository: the working tree's files (tracked and new,
// not ignored) in a scratch folder, installed from the warm pnpm store; the
// scaffold of `rewards` there (with its own `pnpm install`), then the
// generated module's tests (real Postgres), typecheck, lint, `db:generate`
// (its hand-written first migration matches its schema) and `db:migrate` on
// a fresh database; and bad names refused with one line and exit code 2.
// Slow (a copy, installs, tsc): about 40 s.
import { execFile } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";
import { PROVIDED_KEY, type ProvidedPostgres } from "../src/testing/index.ts";

const REPO = fileURLToPath(new URL("../../..", import.meta.url));
const NAME = "rewards";
const PKG = `@softcrum/module-${NAME}`;
const SLOW = 240_000;

interface Ran {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

/** Runs a command to its end and says how it ended; never throws for a non-zero exit. */
function run(
  command: string,
  args: readonly string[],
  options: { cwd: string; env?: NodeJS.ProcessEnv },
): Promise<Ran> {
  const started = Date.now();
  return new Promise((resolve) => {
    execFile(
      command,
      args,
      { cwd: options.cwd, env: options.env ?? childEnv(), maxBuffer: 1 << 26 },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
        resolve({ code, stdout: String(stdout), stderr: String(stderr), ms: Date.now() - started });
      },
    );
  });
}

/** What a failed step printed, for the assertion's message. */
const shown = (ran: Ran) => `exit ${ran.code}\n--- stdout\n${ran.stdout}\n--- stderr\n${ran.stderr}`;

let adminUrl = "";
let stopServer: (() => Promise<void>) | undefined;

/**
 * The environment of the commands: this run's Postgres as TEST_DATABASE_URL;
 * none of this Vitest worker's or the outer pnpm's variables; no colours;
 * installs from the pnpm store before the registry.
 */
function childEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (/^(VITEST|npm_|pnpm_|PNPM_|FORCE_COLOR$|DATABASE_URL$|SOFTCRUM_QUEUE$|NODE_OPTIONS$)/.test(key)) continue;
    env[key] = value;
  }
  return {
    ...env,
    NO_COLOR: "1",
    TEST_DATABASE_URL: adminUrl,
    pnpm_config_prefer_offline: "true",
    ...extra,
  };
}

/** The working tree's files (tracked and untracked, not ignored) as they are now, copied into `to`. */
async function copyWorkingTree(to: string): Promise<number> {
  const listed = await run("git", ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], { cwd: REPO });
  expect(listed.code, shown(listed)).toBe(0);
  let copied = 0;
  for (const file of new Set(listed.stdout.split("\0"))) {
    if (file === "" || file.split("/").includes("node_modules") || file.startsWith(`apps/${NAME}/`)) continue;
    const from = join(REPO, file);
    // Listed but deleted in the working tree (a rename in progress), or a submodule: not a file to copy.
    if (!existsSync(from) || !statSync(from).isFile()) continue;
    mkdirSync(dirname(join(to, file)), { recursive: true });
    copyFileSync(from, join(to, file));
    copied += 1;
  }
  return copied;
}

/** Every file under `dir`, relative to it, sorted. */
function tree(dir: string): string[] {
  const out: string[] = [];
  const walk = (at: string) => {
    for (const entry of readdirSync(at, { withFileTypes: true })) {
      if (entry.name === "node_modules") continue;
      if (entry.isDirectory()) walk(join(at, entry.name));
      else out.push(relative(dir, join(at, entry.name)));
    }
  };
  walk(dir);
  return out.sort();
}

let copy = "";
let failed = false;
const timings: Record<string, number> = {};

beforeAll(async () => {
  // The server this run's global setup found (a testcontainers one included), else the repository's finder.
  const provided = (inject as (key: string) => unknown)(PROVIDED_KEY) as ProvidedPostgres | undefined;
  if (provided?.adminUrl) adminUrl = provided.adminUrl;
  else {
    const server = await findPostgres();
    adminUrl = server.adminUrl;
    stopServer = () => server.stop();
  }
  const started = Date.now();
  copy = mkdtempSync(join(tmpdir(), "softcrum-new-module-"));
  await copyWorkingTree(copy);
  timings["copy"] = Date.now() - started;
  const installed = await run("pnpm", ["install", "--prefer-offline", "--frozen-lockfile=false"], { cwd: copy });
  expect(installed.code, shown(installed)).toBe(0);
  timings["install"] = installed.ms;
}, SLOW);

afterEach((context) => {
  if (context.task.result?.state === "fail") failed = true;
});

afterAll(async () => {
  if (copy && failed) console.warn(`[new-module.test] a test failed: kept the copy at ${copy}`);
  else if (copy) rmSync(copy, { recursive: true, force: true });
  await stopServer?.();
  console.info(`[new-module.test] timings (ms): ${JSON.stringify(timings)}`);
});

describe("a bad name: one line on stderr, exit code 2, nothing written", () => {
  test.each([
    ["Rewards", /^new:module: "Rewards" is not a valid module name: use lowercase letters, digits and single dashes/],
    ["gift_cards", /^new:module: "gift_cards" is not a valid module name/],
    ["9lives", /^new:module: "9lives" is not a valid module name/],
    ["loyalty", /^new:module: apps\/loyalty already exists: choose another name$/],
    ["core", /^new:module: "core" is reserved/],
  ])("%s", async (name, message) => {
    const ran = await run(process.execPath, ["scripts/new-module.mjs", name], { cwd: copy });
    expect(ran.code, shown(ran)).toBe(2);
    expect(ran.stdout).toBe("");
    const lines = ran.stderr.split("\n").filter((line) => line !== "");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(message);
    if (name !== "loyalty") expect(existsSync(join(copy, "apps", name))).toBe(false);
  });

  test("no name at all", async () => {
    const ran = await run(process.execPath, ["scripts/new-module.mjs"], { cwd: copy });
    expect(ran.code).toBe(2);
    expect(ran.stderr.trim().split("\n")).toEqual([
      "new:module: give the module's name, e.g. pnpm new:module rewards (usage: pnpm new:module <name> [--no-install])",
    ]);
  });
});

describe(`pnpm new:module ${NAME}`, () => {
  const app = () => join(copy, "apps", NAME);
  let made: Ran;

  beforeAll(async () => {
    made = await run("pnpm", ["new:module", NAME], { cwd: copy });
    timings["scaffold"] = made.ms;
  }, SLOW);

  test("makes the module, links it, and says what it made and what to run next", () => {
    expect(made.code, shown(made)).toBe(0);
    expect(tree(app())).toEqual([
      "drizzle.config.ts",
      `drizzle/0000_${NAME}_events.sql`,
      "drizzle/meta/0000_snapshot.json",
      "drizzle/meta/_journal.json",
      "package.json",
      "src/composition-root.ts",
      "src/migrate-cli.ts",
      "src/migrations.ts",
      "src/record-event.test.ts",
      "src/record-event.ts",
      "src/schema.ts",
      "test/global-setup.ts",
      "tsconfig.json",
      "vitest.config.ts",
    ]);
    expect(made.stdout).toContain(`Made apps/${NAME} (${PKG}):`);
    expect(made.stdout).toContain(`apps/${NAME}/src/record-event.ts`);
    expect(made.stdout).toContain("pnpm install");
    expect(made.stdout).toContain(`pnpm --filter ${PKG} test`);
    expect(made.stdout).toMatch(new RegExp(`DATABASE_URL=\\S+ pnpm --filter ${PKG} db:migrate`));
    // Linked: the workspace package resolves from the new app.
    expect(existsSync(join(app(), "node_modules/@softcrum/core/package.json"))).toBe(true);
    expect(existsSync(join(app(), "node_modules/.bin/vitest"))).toBe(true);
  });

  test("package.json: private ESM package, the other apps' pinned versions, the four scripts", () => {
    const manifest = JSON.parse(readFileSync(join(app(), "package.json"), "utf8"));
    const loyalty = JSON.parse(readFileSync(join(copy, "apps/loyalty/package.json"), "utf8"));
    expect(manifest).toMatchObject({ name: PKG, private: true, type: "module" });
    expect(manifest.dependencies).toEqual({
      "@electric-sql/pglite": loyalty.dependencies["@electric-sql/pglite"],
      "@softcrum/core": "workspace:*",
      "drizzle-orm": loyalty.dependencies["drizzle-orm"],
      postgres: loyalty.dependencies.postgres,
      zod: loyalty.dependencies.zod,
    });
    for (const dep of ["@types/node", "drizzle-kit", "tsx", "typescript", "vitest"]) {
      expect(manifest.devDependencies[dep], dep).toBe(loyalty.devDependencies[dep]);
    }
    expect(Object.keys(manifest.devDependencies).sort()).toEqual([
      "@types/node",
      "drizzle-kit",
      "tsx",
      "typescript",
      "vitest",
    ]);
    expect(Object.keys(manifest.scripts).sort()).toEqual(["db:generate", "db:migrate", "test", "typecheck"]);
  });

  test("uses the public API of @softcrum/core only", () => {
    for (const file of tree(app()).filter((f) => f.endsWith(".ts"))) {
      const text = readFileSync(join(app(), file), "utf8");
      const imports = [...text.matchAll(/from "([^"]+)"/g)].map((m) => m[1] ?? "");
      for (const spec of imports) {
        expect(spec, `${file} imports ${spec}`).not.toMatch(/^@softcrum\/testing|packages\/core|^\.\.\/\.\.\//);
        if (spec.startsWith("@softcrum/")) {
          expect(spec, file).toMatch(/^@softcrum\/core(\/(module|testing|migrate))?$/);
        }
      }
    }
  });

  test(
    "its tests pass on real Postgres: duplicate → one effect, poison, retry through backoff, composition root",
    async () => {
      const ran = await run("pnpm", ["--filter", PKG, "test"], { cwd: copy });
      timings["module tests"] = ran.ms;
      expect(ran.code, shown(ran)).toBe(0);
      expect(ran.stdout).toMatch(/Tests\s+4 passed \(4\)/);
    },
    SLOW,
  );

  test(
    "it typechecks (tsc, strict)",
    async () => {
      const ran = await run("pnpm", ["--filter", PKG, "typecheck"], { cwd: copy });
      timings["typecheck"] = ran.ms;
      expect(ran.code, shown(ran)).toBe(0);
      expect(ran.stdout).not.toMatch(/error TS\d+/);
    },
    SLOW,
  );

  test(
    "it passes the repository's lint (Biome)",
    async () => {
      const ran = await run(join(copy, "node_modules/.bin/biome"), ["check", `apps/${NAME}`], { cwd: copy });
      expect(ran.code, shown(ran)).toBe(0);
    },
    SLOW,
  );

  test(
    "db:generate finds the first migration up to date with src/schema.ts",
    async () => {
      const ran = await run("pnpm", ["--filter", PKG, "db:generate"], { cwd: copy });
      expect(ran.code, shown(ran)).toBe(0);
      expect(ran.stdout).toContain("No schema changes, nothing to migrate");
      expect(tree(join(app(), "drizzle"))).toHaveLength(3);
    },
    SLOW,
  );

  test(
    "db:migrate on a fresh database: the core's migrations, then the module's; again: nothing to apply",
    async () => {
      const name = uniqueDatabaseName("softcrum_t", "new_module_migrate");
      await withAdmin(adminUrl, (sql) => sql`create database ${sql(name)}`);
      try {
        const env = childEnv({ DATABASE_URL: withDatabase(adminUrl, name) });
        const first = await run("pnpm", ["--filter", PKG, "db:migrate"], { cwd: copy, env });
        expect(first.code, shown(first)).toBe(0);
        expect(first.stdout).toMatch(
          new RegExp(`${NAME} migrations applied: core/0000_\\w+, .*, ${NAME}/0000_${NAME}_events$`, "m"),
        );
        const again = await run("pnpm", ["--filter", PKG, "db:migrate"], { cwd: copy, env });
        expect(again.code, shown(again)).toBe(0);
        expect(again.stdout).toContain(`${NAME} migrations: nothing to apply (already up to date)`);
        const rows = await withAdmin(withDatabase(adminUrl, name), (sql) =>
          sql.unsafe(`select count(*)::int as n from drizzle."__${NAME}_migrations"`),
        );
        expect(rows[0]?.["n"]).toBe(1);
      } finally {
        await withAdmin(adminUrl, (sql) => sql`drop database if exists ${sql(name)} with (force)`);
      }
    },
    SLOW,
  );
});
