/** The ops API's shape, in a module of its own so that the HTTP handlers and the factory do not import each other. */
import type { ReplayBatches } from "./batches.ts";
import type { DeadLetterOperations } from "./operations.ts";

export interface Ops {
  readonly deadLetters: DeadLetterOperations;
  readonly batches: ReplayBatches;
}
