// The Vitest projects of the monorepo. Vitest 4 no longer reads this file by
// itself: vitest.config.ts imports it as `test.projects`.
//
// Found, not listed: every packages/*, apps/* and bench/* directory with a
// vitest.config.ts is a project (its default export). A config that also
// exports `faults` (a project named `<name>:faults`: the slow fault, scale and
// process files, which its default project excludes) adds that project, with
// the package directory as its root. `pnpm test` runs every project but the
// `:faults` ones, `pnpm test:faults` only those, `npx vitest run` all of them.
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { tsImport } from "tsx/esm/api";
import type { TestProjectConfiguration, TestProjectInlineConfiguration } from "vitest/config";

const here = fileURLToPath(new URL(".", import.meta.url));
const projects: TestProjectConfiguration[] = [];
for (const parent of ["packages", "apps", "bench"]) {
  const dirs = readdirSync(join(here, parent), { withFileTypes: true }).filter((entry) => entry.isDirectory());
  for (const name of dirs.map((entry) => entry.name).sort()) {
    const root = join(here, parent, name);
    const config = join(root, "vitest.config.ts");
    if (!existsSync(config)) continue;
    projects.push(config);
    // Node 20 cannot import TypeScript by itself; tsx (a root devDependency) can.
    const { faults } = (await tsImport(pathToFileURL(config).href, import.meta.url)) as {
      faults?: TestProjectInlineConfiguration;
    };
    if (faults) projects.push({ ...faults, root });
  }
}

export default projects;
