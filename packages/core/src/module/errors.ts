/**
 * The errors `createModule` throws for input that names consumers wrongly.
 * Both are `InvalidConfigError`s (code `INVALID_CONFIG`): a module whose
 * wiring is wrong fails at start, never on its first job.
 */
import { InvalidConfigError } from "../errors.ts";

/** A name given to a module (`routes`, `route`, `startWorker`, `consumer`) that none of its consumers has. */
export class UnknownConsumerError extends InvalidConfigError {
  /** The name asked for. */
  readonly consumer: string;
  /** The names the module's consumers have. */
  readonly known: readonly string[];
  constructor(module: string, consumer: string, known: readonly string[], where: string) {
    super(
      `module ${JSON.stringify(module)}: ${where} names consumer ${JSON.stringify(consumer)}, which is not one of its consumers (${
        known.length > 0 ? known.map((k) => JSON.stringify(k)).join(", ") : "it has none"
      })`,
    );
    this.consumer = consumer;
    this.known = known;
  }
}

/** Two consumers of one module with the same name: they would share fences, so each would skip the other's jobs. */
export class DuplicateConsumerError extends InvalidConfigError {
  readonly consumer: string;
  constructor(module: string, consumer: string) {
    super(
      `module ${JSON.stringify(module)}: two consumers are named ${JSON.stringify(consumer)}; a consumer's name is its fence key, so each must be unique`,
    );
    this.consumer = consumer;
  }
}
