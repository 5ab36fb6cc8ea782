// #22 items 1–2: the package as another team gets it. Packs @softcrum/core
// (its prepack builds dist/ with tsdown), lints the tarball (publint, and
// attw for its types), installs it with plain npm into a scratch project
// outside the workspace (no workspace links, peers from the registry), then
// runs a script there with plain `node` (no TypeScript loader) against a fresh
// database, and typechecks a consumer file against the shipped .d.ts under
// strict + exactOptionalPropertyTypes.
import { execFile } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { findPostgres, uniqueDatabaseName, withAdmin, withDatabase } from "@softcrum/testing";
import { afterAll, beforeAll, expect, test } from "vitest";

const run = promisify(execFile);
const CORE = fileURLToPath(new URL("..", import.meta.url));
const FIXTURES = fileURLToPath(new URL("./package-consumer/", import.meta.url));
/** The versions the workspace tests the code against (packages/core/package.json devDependencies). */
const devDeps = (
  JSON.parse(readFileSync(join(CORE, "package.json"), "utf8")) as { devDependencies: Record<string, string> }
).devDependencies;

let work = "";
let tarball = "";
let scratch = "";

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "softcrum-pack-"));
  const packed = await run("pnpm", ["pack", "--pack-destination", work], { cwd: CORE, maxBuffer: 1 << 24 });
  tarball =
    packed.stdout
      .trim()
      .split("\n")
      .filter((line) => line.endsWith(".tgz"))
      .at(-1) ?? "";
  scratch = join(work, "app");
  await run("mkdir", ["-p", scratch]);
  writeFileSync(join(scratch, "package.json"), JSON.stringify({ name: "scratch-app", private: true, type: "module" }));
  for (const file of ["run.mjs", "consumer.ts", "tsconfig.json"])
    copyFileSync(join(FIXTURES, file), join(scratch, file));
  await run(
    "npm",
    [
      "install",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
      tarball,
      `drizzle-orm@${devDeps["drizzle-orm"]}`,
      `zod@${devDeps["zod"]}`,
      `postgres@${devDeps["postgres"]}`,
      `typescript@${devDeps["typescript"]}`,
      `@types/node@${devDeps["@types/node"]}`,
    ],
    { cwd: scratch, maxBuffer: 1 << 24 },
  );
}, 300_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

test("the tarball holds the built package, its migrations, README and LICENSE, and no sources or tests", async () => {
  const { stdout } = await run("tar", ["tzf", tarball]);
  const files = stdout
    .trim()
    .split("\n")
    .map((f) => f.replace(/^package\//, ""));
  for (const file of [
    "package.json",
    "README.md",
    "LICENSE",
    "dist/index.js",
    "dist/index.d.ts",
    "dist/index.js.map",
    "dist/migrate.js",
    "dist/module.d.ts",
    "dist/testing.d.ts",
    "dist/adapters/memory.d.ts",
    "drizzle/meta/_journal.json",
    "drizzle/0000_core_fence_and_dead_letters.sql",
    "patches/postgres@3.4.9.patch",
  ]) {
    expect(files, file).toContain(file);
  }
  expect(files.filter((f) => f.startsWith("src/") || /\.test(-d)?\.ts$/.test(f))).toEqual([]);
  const manifest = JSON.parse((await run("tar", ["xzfO", tarball, "package/package.json"])).stdout) as {
    exports: Record<string, unknown>;
    peerDependencies: Record<string, string>;
    peerDependenciesMeta: Record<string, { optional?: boolean }>;
  };
  expect(manifest.exports["."]).toEqual({ types: "./dist/index.d.ts", import: "./dist/index.js" });
  expect(JSON.stringify(manifest)).not.toContain("workspace:");
  for (const peer of ["drizzle-orm", "zod", "postgres"]) {
    expect(manifest.peerDependencies[peer], peer).toBeDefined();
    expect(manifest.peerDependenciesMeta[peer]?.optional, peer).toBeUndefined();
  }
});

test("publint and are-the-types-wrong pass on the tarball", async () => {
  const publint = await run(join(CORE, "node_modules/.bin/publint"), ["run", tarball, "--strict"], { cwd: work });
  expect(publint.stdout).toContain("All good");
  // ESM only: the CommonJS resolutions of the strict profile do not apply.
  await run(join(CORE, "node_modules/.bin/attw"), [tarball, "--profile", "esm-only", "--no-color"], { cwd: work });
}, 120_000);

test("plain node: migrate a fresh database, deliver a job and its duplicate, one effect", async () => {
  const server = await findPostgres();
  const name = uniqueDatabaseName("pack", "install");
  await withAdmin(server.adminUrl, (sql) => sql.unsafe(`create database "${name}"`));
  try {
    const { stdout } = await run(process.execPath, ["run.mjs", withDatabase(server.adminUrl, name)], { cwd: scratch });
    const seen = JSON.parse(stdout.trim().split("\n").at(-1) ?? "{}") as Record<string, unknown>;
    expect(seen).toEqual({
      applied: expect.any(Number),
      outcomes: ["success", "duplicate"],
      rows: [{ customer_id: "c1", points: 10 }],
      fences: 1,
    });
    expect(seen["applied"]).toBeGreaterThan(20);
  } finally {
    await withAdmin(server.adminUrl, (sql) => sql.unsafe(`drop database if exists "${name}" with (force)`));
  }
}, 120_000);

test("a consumer file typechecks against the shipped .d.ts (strict, exactOptionalPropertyTypes, skipLibCheck off)", async () => {
  // skipLibCheck is off, so every declaration file is checked: ours must have
  // no error; drizzle-orm's own (its gel/mysql dialects without their
  // drivers) are not ours to fix.
  const { stdout } = await run(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], {
    cwd: scratch,
    maxBuffer: 1 << 24,
  }).catch((error: { stdout: string }) => error);
  const errors = stdout.split("\n").filter((line) => /error TS\d+/.test(line));
  expect(errors.filter((line) => !line.startsWith("node_modules/drizzle-orm/"))).toEqual([]);
}, 120_000);

test("a missing required peer fails at import with an error naming it", async () => {
  renameSync(join(scratch, "node_modules/zod"), join(scratch, "node_modules/zod.off"));
  try {
    const failed = await run(process.execPath, ["--input-type=module", "-e", 'await import("@softcrum/core")'], {
      cwd: scratch,
    }).then(
      () => undefined,
      (error: { stderr: string }) => error,
    );
    expect(failed?.stderr).toMatch(/Cannot find package 'zod'/);
  } finally {
    renameSync(join(scratch, "node_modules/zod.off"), join(scratch, "node_modules/zod"));
  }
});
