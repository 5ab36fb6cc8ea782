/**
 * What the adapter tells its observers: transport incidents (counted by
 * kind, logged, and passed to `metrics.transportIncident` and `onIncident`)
 * and what it did with every delivery (`onDelivery` listeners). An
 * observer's bug never changes what happens to a message.
 */
import type { Logger } from "../../ports/logger.ts";
import type { MetricsPort } from "../../ports/metrics.ts";
import type { VercelDeliveryEvent, VercelIncident } from "./types.ts";

export class Incidents {
  readonly #logger: Logger;
  readonly #onIncident: ((incident: VercelIncident) => void) | undefined;
  readonly #metrics: Pick<MetricsPort, "transportIncident"> | undefined;
  readonly #listeners = new Set<(event: VercelDeliveryEvent) => void>();
  readonly #incidents = new Map<string, number>();

  constructor(
    logger: Logger,
    onIncident: ((incident: VercelIncident) => void) | undefined,
    metrics: Pick<MetricsPort, "transportIncident"> | undefined,
  ) {
    this.#logger = logger;
    this.#onIncident = onIncident;
    this.#metrics = metrics;
  }

  report(incident: VercelIncident): void {
    this.#incidents.set(incident.kind, (this.#incidents.get(incident.kind) ?? 0) + 1);
    const fields = {
      kind: incident.kind,
      queue: incident.queue,
      consumer: incident.consumer,
      messageId: incident.messageId,
    };
    if (incident.alert || incident.kind.endsWith("_failed")) this.#logger.error(incident.message, fields);
    else this.#logger.warn(incident.message, fields);
    // An observer's bug must not change what happens to the message.
    try {
      this.#metrics?.transportIncident?.({ queue: incident.queue, consumer: incident.consumer, kind: incident.kind });
    } catch {}
    try {
      this.#onIncident?.(incident);
    } catch {}
  }

  /** Incidents so far, by kind. */
  counts(): Readonly<Record<string, number>> {
    return Object.fromEntries(this.#incidents);
  }

  /** Calls `listener` after every delivery. Returns an unsubscribe function. */
  onDelivery(listener: (event: VercelDeliveryEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  emit(event: VercelDeliveryEvent): void {
    for (const listener of this.#listeners) {
      // An observer's bug must not change what happens to the message.
      try {
        listener(event);
      } catch {}
    }
  }
}
