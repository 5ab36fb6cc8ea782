/**
 * The last lines `pnpm test` prints (#22 item 7): after Vitest's own report
 * (and before pnpm's "Command failed"), one line per failed test — file, test
 * and the first line of its error — or one line saying everything passed. A
 * person reading a red CI log starts at the bottom.
 */
import type { SerializedError } from "vitest";
import type { Reporter, TestModule } from "vitest/node";

const MAX_LINES = 20;

export default class SummaryReporter implements Reporter {
  #started = Date.now();

  onTestRunStart(): void {
    this.#started = Date.now();
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandled: ReadonlyArray<SerializedError>): void {
    const failed: string[] = [];
    let passed = 0;
    for (const module of modules) {
      const file = `[${module.project.name}] ${module.relativeModuleId}`;
      const moduleErrors = module.errors();
      if (moduleErrors.length > 0) failed.push(`${file}: ${firstLine(moduleErrors[0])}`);
      for (const test of module.children.allTests()) {
        const result = test.result();
        if (result.state === "passed") passed++;
        if (result.state === "failed") failed.push(`${file} > ${test.fullName}: ${firstLine(result.errors?.[0])}`);
      }
    }
    for (const error of unhandled) failed.push(`unhandled error: ${firstLine(error)}`);
    const seconds = Math.round((Date.now() - this.#started) / 1000);
    const lines =
      failed.length === 0
        ? [`✓ ${passed} tests passed in ${modules.length} file${modules.length === 1 ? "" : "s"} (${seconds} s)`]
        : [
            `✗ ${failed.length} failed (${passed} passed, ${seconds} s):`,
            ...failed.slice(0, MAX_LINES).map((line) => `  ✗ ${line}`),
            ...(failed.length > MAX_LINES ? [`  … and ${failed.length - MAX_LINES} more above`] : []),
          ];
    process.stdout.write(`\n${lines.join("\n")}\n`);
  }
}

function firstLine(error: { message?: string; name?: string } | undefined): string {
  if (!error) return "failed";
  const message = (error.message ?? "").split("\n").find((line) => line.trim() !== "") ?? "";
  const line = `${error.name && !message.startsWith(error.name) ? `${error.name}: ` : ""}${message}`;
  return line.length > 240 ? `${line.slice(0, 239)}…` : line;
}
