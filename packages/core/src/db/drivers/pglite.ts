/**
 * PGlite (the embedded demo, tests without a server). One in-process session
 * behind PGlite's transaction mutex: a work transaction holds it through
 * PGlite's own `transaction()`, so nothing else runs on the session meanwhile;
 * PGlite sends BEGIN, the engine's settings follow it. No socket, no
 * transaction status: the commit is proven by the transaction id.
 */
import { type Answer, type Driver, type DrizzleInternals, type Gate, type Statement, sessionKind } from "../driver.ts";
import { heldConnection } from "./held.ts";

interface PgliteQuerier {
  query(text: string, params?: unknown[], options?: unknown): Promise<{ rows: Record<string, unknown>[] }>;
}
interface PgliteTx extends PgliteQuerier {
  exec(text: string): Promise<unknown>;
}
interface Pglite extends PgliteQuerier {
  transaction<T>(fn: (tx: PgliteTx) => Promise<T>): Promise<T>;
}

export function pgliteDriver(db: unknown): Driver | undefined {
  const internals = db as DrizzleInternals;
  if (sessionKind(internals) !== "PgliteSession") return undefined;
  const pglite = internals.$client as Pglite | undefined;
  if (typeof pglite?.transaction !== "function") return undefined;
  return {
    name: "PGlite",
    Session: internals.session.constructor as Driver["Session"],
    drizzle: { dialect: internals.dialect, schema: internals.session.schema, options: internals.session.options ?? {} },
    acquire: () =>
      heldConnection<PgliteTx>((inside) => pglite.transaction(inside), {
        query: (tx, { text, params }: Statement): Promise<Answer> =>
          tx.query(text, params ? [...params] : []).then((r) => r.rows),
        exec: (tx, text) => tx.exec(text),
        handlerClient: (tx, gate) => new GatedClient(tx, gate),
        // PGlite's transaction() throws TransactionAbortedError when COMMIT answers ROLLBACK.
        committed: (outcome) =>
          outcome.status === "fulfilled"
            ? "COMMIT"
            : (outcome.reason as { name?: unknown } | undefined)?.name === "TransactionAbortedError"
              ? "ROLLBACK"
              : undefined,
      }),
  };
}

class GatedClient {
  constructor(
    private readonly tx: PgliteQuerier,
    private readonly gate: Gate,
  ) {}

  query(text: string, params?: unknown[], options?: unknown) {
    this.gate.check(text);
    return this.tx.query(text, params, options);
  }
}
