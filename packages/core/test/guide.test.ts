// #22 item 6: docs/writing-a-module.md cannot rot. Its ```ts blocks are the
// files of a small module (first line `// file: <path>`; `// fragment` opts a
// block out): they are written to a scratch project outside the repository
// whose node_modules links @softcrum/core (this package, by its `exports`, so
// only the public API resolves) and the peers, typechecked with tsc under the
// repo's tsconfig.base.json, and run against a fresh database: the deploy
// step (twice), the local run, and the guide's own Vitest tests. What they
// print must equal the guide's ```text blocks marked `<!-- output: <name> -->`.
// The scratch project lives in the OS temp directory, not in the working tree:
// Vitest globs dot-folders, so a concurrent run would pick up its test file.
import { type ExecFileException, execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  type CreatedDatabase,
  findTestPostgres,
  finishDatabase,
  PROVIDED_KEY,
  type ProvidedPostgres,
  uniqueDatabaseName,
  withAdmin,
  withDatabase,
} from "@softcrum/core/testing";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";

const CORE = fileURLToPath(new URL("..", import.meta.url));
const ROOT = resolve(CORE, "../..");
const GUIDE_PATH = join(ROOT, "docs", "writing-a-module.md");

/** What the scratch project's node_modules links, and where from. */
const LINKS: Record<string, string> = {
  "@softcrum/core": CORE,
  "drizzle-orm": join(CORE, "node_modules", "drizzle-orm"),
  zod: join(CORE, "node_modules", "zod"),
  postgres: join(CORE, "node_modules", "postgres"),
  vitest: join(CORE, "node_modules", "vitest"),
  tsx: join(CORE, "node_modules", "tsx"),
  typescript: join(CORE, "node_modules", "typescript"),
  "drizzle-kit": join(ROOT, "node_modules", "drizzle-kit"),
  "@types/node": join(ROOT, "node_modules", "@types", "node"),
};
/** Bare imports a guide block may use: the core by its public subpaths (checked below), and the peers. */
const PEERS = ["drizzle-orm", "drizzle-kit", "zod", "postgres", "vitest"];
/** The command the guide tells readers to generate the first migration with; the test runs the same. */
const GENERATE = "npx drizzle-kit generate --name init";
/** What the test runs, by the name of the output block that shows what it prints. */
const OUTPUTS = ["migrate", "demo"] as const;

interface Block {
  readonly lang: string;
  readonly body: string;
  /** 1-based line of the opening fence. */
  readonly line: number;
  /** The HTML comment on the line before the fence (blank lines skipped), if any. */
  readonly comment: string | undefined;
}

/** The fenced blocks of a Markdown text, in order. */
function blocksOf(markdown: string): Block[] {
  const lines = markdown.split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*$/.exec(lines[i] ?? "");
    if (!open) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i] ?? ""); i++) body.push(lines[i] ?? "");
    if (i >= lines.length) throw new Error(`docs/writing-a-module.md:${start + 1}: a code block is never closed`);
    let before = start - 1;
    while (before >= 0 && (lines[before] ?? "").trim() === "") before--;
    const comment = /^<!--\s*(.*?)\s*-->$/.exec(lines[before] ?? "")?.[1];
    blocks.push({ lang: open[1] ?? "", body: `${body.join("\n")}\n`, line: start + 1, comment });
  }
  return blocks;
}

const guide = readFileSync(GUIDE_PATH, "utf8");
const blocks = blocksOf(guide);
const where = (block: Block) => `docs/writing-a-module.md:${block.line}`;
/** The module's files: `// file: <path>` blocks, by path. */
const files = new Map<string, string>();
const fragments: Block[] = [];
const outputs = new Map<string, string>();
const problems: string[] = [];
for (const block of blocks) {
  if (block.lang === "ts") {
    const first = block.body.split("\n", 1)[0] ?? "";
    const file = /^\/\/ file: (\S+)$/.exec(first)?.[1];
    if (file) {
      if (files.has(file)) problems.push(`${where(block)}: ${file} is written by two blocks`);
      if (file.startsWith("/") || file.split("/").includes("..")) {
        problems.push(`${where(block)}: ${file} is not a path inside the module`);
      }
      files.set(file, block.body);
    } else if (/^\/\/ fragment\b/.test(first)) fragments.push(block);
    else problems.push(`${where(block)}: a ts block must start with "// file: <path>" (or "// fragment")`);
  } else if (block.lang === "text") {
    const name = /^output: (\S+)$/.exec(block.comment ?? "")?.[1];
    if (!name) problems.push(`${where(block)}: a text block is a program's output: mark it <!-- output: <name> -->`);
    else if (outputs.has(name)) problems.push(`${where(block)}: a second output block named ${name}`);
    else outputs.set(name, block.body);
  } else if (block.lang !== "sh") {
    problems.push(
      `${where(block)}: a ${block.lang || "plain"} block: use ts (a file), sh (not run) or text (an output)`,
    );
  }
}

/** The core's public subpaths: its package.json `exports`. */
const corePaths = new Set(
  Object.keys((JSON.parse(readFileSync(join(CORE, "package.json"), "utf8")) as { exports: object }).exports).map(
    (key) => key.replace(/^\./, "@softcrum/core"),
  ),
);

/** Why an import of `file` is not allowed, or undefined. */
function importProblem(file: string, specifier: string): string | undefined {
  if (specifier.startsWith("node:")) return undefined;
  if (specifier.startsWith(".")) {
    const target = join(dirname(file), specifier);
    if (target.startsWith("..")) return "reaches outside the module";
    return files.has(target) ? undefined : `is not one of the guide's files (${target})`;
  }
  if (specifier.startsWith("@softcrum/")) {
    return corePaths.has(specifier) ? undefined : "is not a public entry point of @softcrum/core (its exports)";
  }
  const name = specifier.startsWith("@") ? specifier.split("/").slice(0, 2).join("/") : specifier.split("/")[0];
  return PEERS.includes(name ?? "") ? undefined : "is not @softcrum/core or one of its peers";
}

const env = (extra: Record<string, string>): NodeJS.ProcessEnv => {
  const clean: NodeJS.ProcessEnv = {};
  // The child runs as a reader's shell would: none of this run's Vitest or queue settings.
  for (const [key, value] of Object.entries(process.env)) {
    if (!/^VITEST|^SOFTCRUM_QUEUE$|^DATABASE_URL$|^TEST_DATABASE_URL$|^NODE_OPTIONS$/.test(key)) clean[key] = value;
  }
  return { ...clean, NO_COLOR: "1", ...extra };
};

interface Ran {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `node …args` in the scratch project; never rejects. */
function node(args: readonly string[], childEnv: NodeJS.ProcessEnv, timeoutMs = 120_000): Promise<Ran> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      args,
      { cwd: scratch, env: childEnv, timeout: timeoutMs, maxBuffer: 1 << 24 },
      (error: ExecFileException | null, stdout, stderr) => {
        done({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr });
      },
    );
  });
}
const shown = (ran: Ran) => `exit ${ran.code}\n--- stdout\n${ran.stdout}\n--- stderr\n${ran.stderr}`;

let scratch = "";
let database: CreatedDatabase | undefined;
let adminUrl = "";
let typecheck: Promise<Ran> | undefined;
let failed = false;

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), "softcrum-guide-"));
  for (const [name, target] of Object.entries(LINKS)) {
    const link = join(scratch, "node_modules", name);
    mkdirSync(dirname(link), { recursive: true });
    symlinkSync(target, link, "dir");
  }
  // What `npm init -y && npm pkg set type=module` leaves, and the repo's compiler options.
  writeFileSync(
    join(scratch, "package.json"),
    `${JSON.stringify({ name: "cashback", private: true, type: "module" })}\n`,
  );
  writeFileSync(
    join(scratch, "tsconfig.json"),
    `${JSON.stringify({ extends: join(ROOT, "tsconfig.base.json"), include: ["**/*.ts"], exclude: ["node_modules"] })}\n`,
  );
  for (const [file, text] of files) {
    mkdirSync(dirname(join(scratch, file)), { recursive: true });
    writeFileSync(join(scratch, file), text);
  }
  // The typecheck takes longest: it runs while the programs do.
  typecheck = node(
    [join(scratch, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"],
    env({}),
    240_000,
  );
  if (files.has("drizzle.config.ts")) {
    const generated = await node(
      [join(scratch, "node_modules", "drizzle-kit", "bin.cjs"), ...GENERATE.split(" ").slice(2)],
      env({}),
    );
    if (generated.code !== 0) throw new Error(`${GENERATE} failed:\n${shown(generated)}`);
  }
  const provided = inject(PROVIDED_KEY as never) as ProvidedPostgres | undefined;
  adminUrl = provided?.adminUrl ?? (await findTestPostgres()).adminUrl;
  const name = uniqueDatabaseName("softcrum_t", "guide");
  await withAdmin(adminUrl, (sql) => sql`create database ${sql(name)}`);
  database = { adminUrl, name, url: withDatabase(adminUrl, name) };
}, 120_000);

afterEach((context) => {
  if (context.task.result?.state === "fail") failed = true;
});

afterAll(async () => {
  await typecheck; // never leave tsc reading a folder being removed
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  if (database) await finishDatabase(database, failed);
});

const withDb = () => env({ DATABASE_URL: database?.url ?? "" });
let migration: Promise<[Ran, Ran]> | undefined;
/** The guide's deploy step, run twice, once per file (the local run needs it, also when filtered to alone). */
const migrateTwice = () =>
  (migration ??= (async () => {
    const first = await node(["--import", "tsx", "src/migrate-cli.ts"], withDb());
    const second = await node(["--import", "tsx", "src/migrate-cli.ts"], withDb());
    return [first, second] as [Ran, Ran];
  })());

describe("docs/writing-a-module.md", () => {
  test("every block is a file of the module, a marked output or a shell command; imports are public", () => {
    expect(problems).toEqual([]);
    expect(fragments.length, "fragments are not checked: keep them few").toBeLessThanOrEqual(3);
    for (const file of ["src/migrate-cli.ts", "src/demo.ts", "vitest.config.ts", "drizzle.config.ts"]) {
      expect([...files.keys()], `the test runs ${file}`).toContain(file);
    }
    expect([...outputs.keys()].sort()).toEqual([...OUTPUTS].sort());
    const bad: string[] = [];
    for (const [file, text] of files) {
      for (const [, specifier] of text.matchAll(/(?:from|import)\s*\(?\s*"([^"]+)"/g)) {
        const problem = importProblem(file, specifier ?? "");
        if (problem) bad.push(`${file}: "${specifier}" ${problem}`);
      }
    }
    expect(bad).toEqual([]);
    // The shell blocks name files the guide has, and the generate command the test runs.
    const shell = blocks.filter((b) => b.lang === "sh").map((b) => b.body);
    for (const [, file] of shell.join("\n").matchAll(/node --import tsx (\S+)/g)) {
      expect([...files.keys()], `a shell block runs ${file}`).toContain(file);
    }
    expect(shell.join("\n")).toContain(GENERATE);
  });

  test("a service refuses a database that is not migrated", async () => {
    const ran = await node(["--import", "tsx", "src/demo.ts"], withDb());
    expect(ran.code, shown(ran)).not.toBe(0);
    expect(ran.stderr).toMatch(/NotMigratedError|the database is not migrated/);
    expect(ran.stdout).toBe("");
  }, 120_000);

  test("the deploy step migrates the core, then the module; again, nothing to do", async () => {
    const [first, second] = await migrateTwice();
    expect(first.code, shown(first)).toBe(0);
    expect(second.code, shown(second)).toBe(0);
    expect(existsSync(join(scratch, "drizzle", "0000_init.sql")), `${GENERATE} names the first migration`).toBe(true);
    expect(first.stdout + second.stdout).toBe(outputs.get("migrate"));
  }, 120_000);

  test("the local run prints what the guide shows", async () => {
    for (const step of await migrateTwice()) expect(step.code, shown(step)).toBe(0);
    const ran = await node(["--import", "tsx", "src/demo.ts"], withDb());
    expect(ran.code, shown(ran)).toBe(0);
    expect(ran.stdout).toBe(outputs.get("demo"));
  }, 120_000);

  test("the guide's own tests pass (Vitest, on a template database of their own)", async () => {
    const ran = await node(
      [join(scratch, "node_modules", "vitest", "vitest.mjs"), "run"],
      env({ TEST_DATABASE_URL: adminUrl }),
      180_000,
    );
    expect(ran.code, shown(ran)).toBe(0);
    const passed = Number(/Tests\s+(\d+) passed/.exec(ran.stdout)?.[1] ?? 0);
    const written = [...files].filter(([file]) => file.endsWith(".test.ts"));
    const declared = written.reduce((n, [, text]) => n + (text.match(/^\s*test\(/gm)?.length ?? 0), 0);
    expect(declared).toBeGreaterThan(0);
    expect(passed, shown(ran)).toBe(declared);
  }, 200_000);

  test("every file typechecks (tsc, strict, the repo's tsconfig.base.json)", async () => {
    const ran = await (typecheck as Promise<Ran>);
    expect(ran.stdout + ran.stderr).toBe("");
    expect(ran.code).toBe(0);
    // The scratch project stays outside the repository: nothing was written to the working tree.
    expect(relative(ROOT, scratch).startsWith("..")).toBe(true);
  }, 250_000);
});
