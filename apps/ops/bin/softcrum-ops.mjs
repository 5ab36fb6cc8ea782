#!/usr/bin/env node
// The operator CLI's bin (`softcrum-ops`, and `pnpm ops`): runs the compiled
// dist/cli.mjs with plain Node. From a fresh clone, or after a source changed,
// it compiles first (esbuild, a fraction of a second), so there is no build
// step to remember and never a stale build.
import { pathToFileURL } from "node:url";
import { isStale, OUTFILE } from "../build.mjs";

if (isStale()) {
  const { buildCli } = await import("../build.mjs");
  await buildCli();
}
const { runCli } = await import(pathToFileURL(OUTFILE).href);
await runCli(process.argv.slice(2));
