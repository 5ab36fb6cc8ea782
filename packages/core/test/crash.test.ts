import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { useTestDatabase } from "@softcrum/testing";
import { afterEach, beforeAll, describe, expect, test } from "vitest";
import { z } from "zod";
import { bindConsumer, createEnvelope, defineConsumer } from "../src/index.ts";
import { createEffectsTable, effects, silentLogger } from "./fixtures.ts";

const pg = useTestDatabase("crash");
const children: ChildProcess[] = [];

beforeAll(async () => {
  await createEffectsTable(pg.sql);
});
afterEach(() => {
  for (const child of children.splice(0)) child.kill("SIGKILL");
});

/** Starts crash-worker.ts in its own Node process and resolves once it prints `marker`. */
function startWorker(
  mode: "inside-transaction" | "after-commit",
  body: string,
  applicationName: string,
  marker: string,
) {
  const script = fileURLToPath(new URL("./crash-worker.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script, pg.url, mode, body, applicationName], {
    cwd: fileURLToPath(new URL("..", import.meta.url)),
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let output = "";
  return new Promise<ChildProcess>((resolve, reject) => {
    child.stdout?.on("data", (chunk) => {
      output += chunk;
      if (output.includes(marker)) resolve(child);
    });
    child.stderr?.on("data", (chunk) => {
      output += chunk;
    });
    child.on("exit", (code) => reject(new Error(`worker exited (${code}) before "${marker}": ${output}`)));
  });
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

const counts = async (jobId: string) => {
  const [row] = await pg.sql<{ fences: number; effects: number }[]>`
    select (select count(*)::int from core.processed_jobs where job_id = ${jobId}) as fences,
           (select count(*)::int from test_effects where job_id = ${jobId}) as effects`;
  return row;
};

const redeliveryConsumer = defineConsumer({
  name: "crash.award",
  queue: "crash.points",
  kind: "points.award.v1",
  schema: z.object({ customerId: z.string(), points: z.number() }),
  async handle(data, { tx, envelope }) {
    await tx.insert(effects).values({ jobId: envelope.job_id, consumer: "crash.award", amount: data.points });
  },
});

describe("a worker killed with SIGKILL", () => {
  test("inside the work transaction leaves neither fence nor effect, and the redelivery applies the job once", async () => {
    const envelope = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 40 } });
    const appName = `crash-inside-${process.pid}`;
    const child = await startWorker("inside-transaction", JSON.stringify(envelope), appName, "IN_TRANSACTION");
    expect(await counts(envelope.job_id)).toEqual({ fences: 0, effects: 0 }); // not committed yet

    await killAndWaitForBackend(child, appName);
    expect(await counts(envelope.job_id)).toEqual({ fences: 0, effects: 0 });

    const bound = bindConsumer(redeliveryConsumer, { db: pg.db, logger: silentLogger });
    expect(await bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 2 })).toEqual({
      outcome: "success",
      ack: true,
    });
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });
  });

  test("after commit but before the ack makes the redelivery a duplicate: still one effect", async () => {
    const envelope = createEnvelope({ tenantId: "t", kind: "points.award.v1", data: { customerId: "c", points: 5 } });
    const appName = `crash-after-${process.pid}`;
    const child = await startWorker("after-commit", JSON.stringify(envelope), appName, "COMMITTED success");
    await killAndWaitForBackend(child, appName);
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });

    const bound = bindConsumer(redeliveryConsumer, { db: pg.db, logger: silentLogger });
    expect(await bound.deliver({ body: JSON.stringify(envelope), deliveryCount: 2 })).toEqual({
      outcome: "duplicate",
      ack: true,
    });
    expect(await counts(envelope.job_id)).toEqual({ fences: 1, effects: 1 });
  });
});
