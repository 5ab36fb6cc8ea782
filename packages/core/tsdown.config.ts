/**
 * The published build of @softcrum/core (#22): ESM JavaScript, `.d.ts` and
 * source maps for every subpath of package.json's `exports`, into dist/.
 * The workspace never needs it: its `exports` point at the TypeScript
 * sources, and `publishConfig.exports` (applied by `pnpm pack`/`publish`)
 * points the tarball at dist/. Dependencies and peers stay imports.
 */
import { readFileSync } from "node:fs";
import { defineConfig } from "tsdown";

const pkg = JSON.parse(readFileSync(new URL("./package.json", import.meta.url), "utf8")) as {
  exports: Record<string, string>;
};

/** "./adapters/memory" → "adapters/memory", "." → "index": dist/<name>.js and dist/<name>.d.ts. */
const entry = Object.fromEntries(
  Object.entries(pkg.exports)
    .filter(([, source]) => source.endsWith(".ts"))
    .map(([subpath, source]) => [subpath === "." ? "index" : subpath.slice(2), source]),
);

export default defineConfig({
  entry,
  format: "esm",
  platform: "node",
  target: "node20.11",
  outDir: "dist",
  clean: true,
  dts: { sourcemap: false },
  sourcemap: true,
  unbundle: false,
  fixedExtension: false,
  tsconfig: "tsconfig.build.json",
});
