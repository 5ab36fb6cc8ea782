/**
 * Compiles the operator CLI into one ES module, dist/cli.mjs, so the installed
 * bin starts with plain Node, no TypeScript loader (#10 item 13). The
 * workspace's TypeScript (@softcrum/*) and the npm dependencies are bundled;
 * only what a CLI run with DATABASE_URL never loads stays out (the embedded
 * PGlite and its Drizzle driver). dist/ is build output: git-ignored, rebuilt by bin/softcrum-ops.mjs
 * whenever a source is newer.
 */
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";

export const ENTRY = fileURLToPath(new URL("./src/cli.ts", import.meta.url));
export const OUTFILE = fileURLToPath(new URL("./dist/cli.mjs", import.meta.url));
/** Where the build came from: sources are found by absolute path, so a moved checkout rebuilds. */
const STAMP = fileURLToPath(new URL("./dist/built-from", import.meta.url));
/** Every folder whose sources end up in the bundle. */
export const SOURCE_DIRS = ["./src", "../../packages/core/src", "../loyalty/src"].map((dir) =>
  fileURLToPath(new URL(dir, import.meta.url)),
);

export async function buildCli() {
  // Loaded only to build: a run with a fresh build never pays for it.
  const { build } = await import("esbuild");
  await build({
    entryPoints: [ENTRY],
    outfile: OUTFILE,
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    external: ["@electric-sql/pglite", "drizzle-orm/pglite"],
    // Some bundled CommonJS dependencies call require() for Node built-ins.
    banner: {
      js: "import { createRequire as __softcrumRequire } from 'node:module'; const require = __softcrumRequire(import.meta.url);",
    },
    plugins: [sourceLocations],
    logLevel: "warning",
    legalComments: "none",
  });
  writeFileSync(STAMP, ENTRY);
}

/**
 * In the bundle every module would see dist/cli.mjs as its `import.meta.url`;
 * the workspace's sources find files beside them with it (the migration
 * folders), so each keeps its own source location.
 */
const sourceLocations = {
  name: "source-locations",
  setup(b) {
    b.onLoad({ filter: /\/(packages|apps)\/[^/]+\/src\/.*\.ts$/ }, (args) => ({
      contents: readFileSync(args.path, "utf8").replaceAll(
        "import.meta.url",
        JSON.stringify(pathToFileURL(args.path).href),
      ),
      loader: "ts",
    }));
  },
};

/** Newest modification time of a TypeScript source in the bundle (tests excluded). */
export function newestSource(dirs = SOURCE_DIRS) {
  let newest = 0;
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".test.ts"))
        newest = Math.max(newest, statSync(path).mtimeMs);
    }
  };
  for (const dir of dirs) walk(dir);
  return newest;
}

/** Whether dist/cli.mjs is missing, older than a source, or built in another checkout. */
export function isStale() {
  try {
    return readFileSync(STAMP, "utf8") !== ENTRY || statSync(OUTFILE).mtimeMs < newestSource();
  } catch {
    return true;
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await buildCli();
