/**
 * What the queue tells its observers (`onDelivery`): one event per finished
 * delivery, handed to every listener in turn.
 */
import type { DeliveryResult } from "../../queue-port.ts";

/** One finished delivery, for observers (the demo's summary, tests). */
export interface DeliveryEvent {
  readonly queue: string;
  readonly consumer: string;
  readonly messageId: string;
  readonly deliveryCount: number;
  /** Clock time the delivery started. */
  readonly at: number;
  /** `replay`: from the consumer's replay lane (`publishReplay`); `live`: everything else. */
  readonly lane: "live" | "replay";
  /**
   * The harness's result, or `thrown` when `deliver` itself threw or did not
   * settle within the visibility timeout (treated as a crash: redelivered).
   * An abandoned delivery that settles later reports nothing more.
   */
  readonly result: DeliveryResult | { readonly outcome: "thrown"; readonly error: string };
}

/** A queue's observers. */
export class DeliveryListeners {
  readonly #listeners = new Set<(event: DeliveryEvent) => void>();

  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  add(listener: (event: DeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  emit(event: DeliveryEvent): void {
    for (const listener of this.#listeners) {
      // An observer's bug must not break deliveries or starve later observers.
      try {
        listener(event);
      } catch {}
    }
  }
}
