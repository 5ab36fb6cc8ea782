import { type ChildProcess, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, test } from "vitest";
import { bindConsumer, createEnvelope } from "../src/index.ts";
import { effectConsumer, silentLogger, useEffectsDatabase } from "./fixtures.ts";

const pg = useEffectsDatabase("processes", "test_effects, core.processed_jobs");
const children: ChildProcess[] = [];

afterEach(() => {
  for (const child of children.splice(0)) child.kill("SIGKILL");
});

/** Starts worker-process.ts in its own Node process; resolves with what it printed once it prints `marker`. */
function startWorker(mode: string, input: string, applicationName: string, marker: string) {
  const script = fileURLToPath(new URL("./worker-process.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script, pg.url, mode, input, applicationName], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let output = "";
  let errors = "";
  const printed = new Promise<string>((resolve, reject) => {
    child.stdout?.on("data", (chunk) => {
      output += chunk;
      if (output.includes(marker)) resolve(output);
    });
    child.stderr?.on("data", (chunk) => {
      errors += chunk;
    });
    child.on("exit", (code) => reject(new Error(`worker exited (${code}) before "${marker}": ${output}${errors}`)));
  });
  return { child, printed };
}

async function killAndWaitForBackend(child: ChildProcess, applicationName: string) {
  child.kill("SIGKILL");
  // Postgres rolls back the open transaction when it notices the socket is
  // gone; wait until the worker's backend has left.
  for (let i = 0; i < 200; i++) {
    const [row] = await pg.sql<{ n: number }[]>`
      select count(*)::int as n from pg_stat_activity where application_name = ${applicationName}`;
    if (row?.n === 0) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error("the killed worker's backend did not go away");
}

const counts = async (jobId?: string) => {
  const [row] = await pg.sql<{ fences: number; effects: number }[]>`
    select (select count(*)::int from core.processed_jobs where ${jobId ?? null}::uuid is null or job_id = ${jobId ?? null}) as fences,
           (select count(*)::int from test_effects where ${jobId ?? null}::uuid is null or job_id = ${jobId ?? null}) as effects`;
  return row;
};

const award = (points: number) =>
  createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points } });
/** The same consumer as the worker processes', in this process, for the redelivery. */
const redeliver = (body: string) =>
  bindConsumer(effectConsumer("worker.award"), { db: pg.db, logger: silentLogger }).deliver({ body, deliveryCount: 2 });

describe("a worker killed with SIGKILL", () => {
  test("inside the work transaction leaves neither fence nor effect, and the redelivery applies the job once", async () => {
    const envelope = award(40);
    const appName = `crash-inside-${process.pid}`;
    const { child, printed } = startWorker("inside-transaction", JSON.stringify(envelope), appName, "IN_TRANSACTION");
    await printed;
    expect(await counts(envelope.job_id)).toEqual({ fences: 0, effects: 0 }); // not committed yet

    await killAndWaitForBackend(child, appName);
    expect(await counts(envelope.job_id)).toEqual({ fences: 0, effects: 0 });

    expect(await redeliver(JSON.stringify(envelope))).toEqual({ outcome: "success", ack: true });
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });
  });

  test("after commit but before the ack makes the redelivery a duplicate: still one effect", async () => {
    const envelope = award(5);
    const appName = `crash-after-${process.pid}`;
    const { child, printed } = startWorker("after-commit", JSON.stringify(envelope), appName, "COMMITTED success");
    await printed;
    await killAndWaitForBackend(child, appName);
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });

    expect(await redeliver(JSON.stringify(envelope))).toEqual({ outcome: "duplicate", ack: true });
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });
  });
});

test("three worker processes delivering the same 60 jobs at once apply each exactly once", async () => {
  const bodies = Array.from({ length: 60 }, (_, i) => JSON.stringify(award(i + 1)));
  // Each process walks the list in its own order, so they collide on different jobs.
  const orders = [bodies, [...bodies.slice(20), ...bodies.slice(0, 20)], [...bodies].reverse()];
  const starts = await Promise.all(
    orders.map(async (order, n) => {
      const file = join(tmpdir(), `softcrum-jobs-${process.pid}-${n}.json`);
      await writeFile(file, JSON.stringify(order));
      return startWorker("deliver-all", file, `multi-${process.pid}-${n}`, "\n").printed;
    }),
  );
  const outcomes = (await Promise.all(starts)).map(
    (out) => JSON.parse(out.replace(/^DONE /, "")) as Record<string, number>,
  );
  const total = (key: string) => outcomes.reduce((sum, o) => sum + (o[key] ?? 0), 0);
  expect(total("success")).toBe(60);
  expect(total("duplicate")).toBe(120);
  expect(await counts()).toEqual({ fences: 60, effects: 60 });
  const [sum] = await pg.sql<{ total: number }[]>`select sum(amount)::int as total from test_effects`;
  expect(sum?.total).toBe((60 * 61) / 2);
});
