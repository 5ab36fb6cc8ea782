/**
 * A bound consumer's dead-letter alerts: fire and forget (the letter is the
 * evidence, the alert only points at it), counted when they fail, and
 * flushed on demand within a bound (a transport whose process may end once
 * it answers, a push route, waits for them with `flush()`): an alert sink
 * that hangs never holds a delivery's answer past `flushTimeoutMs`.
 */
import { describeError } from "../errors.ts";
import type { AlertPort, DeadLetterAlert } from "../ports/alerts.ts";
import type { Logger } from "../ports/logger.ts";
import type { MetricsPort } from "../ports/metrics.ts";

export class AlertSender {
  /** Alerts handed to the port and not yet settled; `flush` waits for them. */
  readonly #inFlight = new Set<Promise<unknown>>();
  /** An alert was raised since the last `flush`: only then is the port flushed. */
  #toFlush = false;
  /** The flush under way: a caller whose alert it covers waits for it too. */
  #flushing: Promise<void> | undefined;

  constructor(
    private readonly alerts: AlertPort,
    private readonly metrics: MetricsPort,
    private readonly logger: Logger,
    private readonly owner: { readonly queue: string; readonly consumer: string },
    private readonly flushTimeoutMs: number,
  ) {}

  send(alert: DeadLetterAlert): void {
    const failed = (thrown: unknown) => {
      this.metrics.alertFailed(this.owner);
      this.logger.warn(`dead-letter alert failed: ${describeError(thrown)}`, { deadLetterId: alert.deadLetterId });
    };
    this.#toFlush = true;
    try {
      const sent = Promise.resolve(this.alerts.deadLetterCreated(alert)).catch(failed);
      this.#inFlight.add(sent);
      void sent.finally(() => this.#inFlight.delete(sent));
    } catch (thrown) {
      failed(thrown);
    }
  }

  async flush(): Promise<void> {
    if (this.#toFlush) {
      this.#toFlush = false;
      const flushing = this.#flushNow(this.#flushing);
      this.#flushing = flushing;
      void flushing.finally(() => {
        if (this.#flushing === flushing) this.#flushing = undefined;
      });
    }
    // Another caller may have taken the flag for an alert of ours: its flush covers it.
    await this.#flushing;
  }

  async #flushNow(previous: Promise<void> | undefined): Promise<void> {
    await previous;
    let timer: NodeJS.Timeout | undefined;
    const gaveUp = new Promise<"timeout">((resolve) => {
      timer = setTimeout(resolve, this.flushTimeoutMs, "timeout");
    });
    try {
      const flushed = Promise.allSettled([...this.#inFlight]).then(() => this.alerts.flush?.());
      if ((await Promise.race([flushed, gaveUp])) === "timeout") {
        flushed.catch(() => {}); // settles later, or never: nobody waits for it
        throw new Error(`the alert sink did not flush within ${this.flushTimeoutMs} ms`);
      }
    } catch (thrown) {
      this.metrics.alertFailed(this.owner);
      this.logger.warn(`dead-letter alerts could not be flushed: ${describeError(thrown)}`);
    } finally {
      clearTimeout(timer);
    }
  }
}
