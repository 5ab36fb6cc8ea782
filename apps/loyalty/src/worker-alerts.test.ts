import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { useModuleDatabase } from "@softcrum/core/testing";
import { afterEach, beforeEach, expect, test } from "vitest";
import { FakeIngest } from "../../../packages/core/test/fake-betterstack.ts";

const pg = useModuleDatabase("loyalty-worker-alerts");

let ingest: FakeIngest;
let endpoint: string;
beforeEach(async () => {
  ingest = new FakeIngest();
  endpoint = await ingest.start();
  await pg.sql`truncate core.dead_letters, core.alert_windows cascade`;
});
afterEach(async () => {
  await ingest.stop();
});

const unreported = async () =>
  (await pg.sql<{ n: number }[]>`select coalesce(sum(unreported), 0)::int as n from core.alert_windows`)[0]?.n;

test("a worker process sent SIGTERM inside the coalescing window sends the summary of the letters it counted before it exits (#9 item 8)", async () => {
  const script = fileURLToPath(new URL("../test/alerting-worker.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script, "3"], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    env: {
      ...process.env,
      DATABASE_URL: pg.url,
      BETTERSTACK_SOURCE_TOKEN: "worker-token",
      BETTERSTACK_ENDPOINT: endpoint,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (chunk) => {
    output += chunk;
  });
  child.stderr.on("data", (chunk) => {
    output += chunk;
  });
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", () => output.includes("READY") && resolve());
      void exited.then((code) => reject(new Error(`worker exited (${code}) before READY: ${output}`)));
    });
    // One alert out; the other two letters wait for the window's summary, counted in Postgres.
    expect(ingest.logs.map((l) => l["softcrum_alert"])).toEqual(["dead_letter"]);
    expect(await unreported()).toBe(2);

    child.kill("SIGTERM");
    expect(await exited, output).toBe(0);
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
  }
  expect(output).toContain("STOPPED");
  expect(ingest.logs.map((l) => [l["softcrum_alert"], l["count"]])).toEqual([
    ["dead_letter", undefined],
    ["dead_letters_coalesced", 2],
  ]);
  expect(ingest.logs[1]).toMatchObject({ error_class: "poison", consumer: "loyalty.award-points" });
  expect(await unreported()).toBe(0);
  const [letters] = await pg.sql<{ n: number }[]>`select count(*)::int as n from core.dead_letters`;
  expect(letters?.n).toBe(3);
});
