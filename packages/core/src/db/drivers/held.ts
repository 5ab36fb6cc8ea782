/**
 * A connection that lives inside a driver's own callback transaction
 * (PGlite's `transaction()`, postgres.js's `begin()`): the driver sent BEGIN
 * before the callback runs, COMMIT is the callback returning and ROLLBACK its
 * throwing. Used where the driver gives no connection of our own (PGlite: one
 * in-process session behind a mutex) or cannot prove one (postgres.js without
 * patches/postgres@3.4.9.patch, porsager/postgres #1208).
 */
import type { Answer, DriverConnection, Gate, Statement } from "../driver.ts";

export interface HeldOps<Tx> {
  query(tx: Tx, statement: Statement): Promise<Answer>;
  /** A simple query (several statements, no parameters). */
  exec(tx: Tx, text: string): Promise<unknown>;
  handlerClient(tx: Tx, gate: Gate): unknown;
  /** The command tag COMMIT answered, from what the driver's transaction call resolved with or threw. */
  committed(outcome: PromiseSettledResult<unknown>): string | undefined;
  /** See `DriverConnection.batches`. @default true */
  readonly batches?: boolean;
}

const ROLL_BACK = new Error("rolled back by the work-transaction engine");

/** Opens the driver's transaction and resolves once its callback holds it. */
export function heldConnection<Tx>(
  open: (inside: (tx: Tx) => Promise<void>) => Promise<unknown>,
  ops: HeldOps<Tx>,
): Promise<DriverConnection> {
  return new Promise((resolve, reject) => {
    let end!: (how: "commit" | "rollback") => void;
    const ended = new Promise<"commit" | "rollback">((r) => {
      end = r;
    });
    let entered = false;
    const finished = open(async (tx) => {
      entered = true;
      resolve(connection(tx));
      if ((await ended) === "rollback") throw ROLL_BACK;
    });
    const settled = finished.then(
      (value) => ({ status: "fulfilled", value }) as const,
      (reason: unknown) => ({ status: "rejected", reason }) as const,
    );
    void settled.then((outcome) => {
      if (!entered) reject(outcome.status === "rejected" ? outcome.reason : new Error("the transaction never began"));
    });

    function connection(tx: Tx): DriverConnection {
      let over = false;
      const close = async (how: "commit" | "rollback") => {
        if (over) return undefined;
        over = true;
        end(how);
        return settled;
      };
      return {
        // The driver's callback transaction gives no status of its own: proven by transaction id.
        provesByStatus: false,
        batches: ops.batches !== false,
        // One statement at a time inside the driver's own callback transaction.
        pipelines: false,
        start: async (opening, statements) => {
          const results: PromiseSettledResult<Answer>[] = [];
          try {
            await ops.exec(tx, opening.inTransaction);
            results.push({ status: "fulfilled", value: [] });
          } catch (reason) {
            return [{ status: "rejected", reason }, ...statements.map(notSent)];
          }
          for (const statement of statements) {
            if (results.some((r) => r.status === "rejected")) {
              results.push(notSent());
              continue;
            }
            try {
              results.push({ status: "fulfilled", value: await ops.query(tx, statement) });
            } catch (reason) {
              results.push({ status: "rejected", reason });
            }
          }
          return results;
        },
        query: (statement) => ops.query(tx, statement),
        transactionStatus: () => null,
        commit: async () => {
          const outcome = await close("commit");
          if (outcome === undefined) return undefined;
          if (outcome.status === "rejected" && ops.committed(outcome) === undefined) throw outcome.reason;
          return ops.committed(outcome);
        },
        rollback: async () => {
          const outcome = await close("rollback");
          return outcome?.status === "rejected" && outcome.reason === ROLL_BACK ? "ROLLBACK" : undefined;
        },
        // Only called once the transaction ended (committed or rolled back),
        // or for a connection that arrived after the engine gave up on it.
        release: () => void close("rollback"),
        destroy: () => void close("rollback"),
        handlerClient: (gate) => ops.handlerClient(tx, gate),
      };
    }
  });
}

function notSent(): PromiseRejectedResult {
  return { status: "rejected", reason: new Error("not sent: an earlier statement failed") };
}
