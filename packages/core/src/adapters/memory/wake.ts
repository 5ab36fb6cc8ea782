/**
 * When the queue has something to do next, and who waits for it: whether it
 * is busy, the next clock time a message comes due or a lease expires, the
 * real-clock timer that pumps then, and `drain()`.
 */
import type { Clock } from "../../clock.ts";
import { timerDelay } from "../../timers.ts";
import { type Lease, type Subscription, waiting } from "./lanes.ts";

/** The least time between two looks for the next due message (real clock). */
const RESCAN_MS = 5;

export class Wakeups {
  readonly #clock: Clock;
  readonly #lanes: () => Iterable<Subscription>;
  readonly #inFlight: ReadonlySet<Lease>;
  readonly #isClosed: () => boolean;
  readonly #pumpAll: () => void;
  readonly #idleWaiters = new Set<() => void>();
  #timer: NodeJS.Timeout | undefined;
  /** When afterChange last looked for the next due time (performance.now()), and its pending look. */
  #scannedAt = Number.NEGATIVE_INFINITY;
  #rescan: NodeJS.Timeout | undefined;

  /**
   * @param lanes every subscription, the live ones and the replay lanes.
   * @param inFlight deliveries in flight, abandoned ones excluded.
   * @param pumpAll starts whatever is due on every lane.
   */
  constructor(
    clock: Clock,
    lanes: () => Iterable<Subscription>,
    inFlight: ReadonlySet<Lease>,
    isClosed: () => boolean,
    pumpAll: () => void,
  ) {
    this.#clock = clock;
    this.#lanes = lanes;
    this.#inFlight = inFlight;
    this.#isClosed = isClosed;
    this.#pumpAll = pumpAll;
  }

  async drain(): Promise<void> {
    // The delivery timers are unref'd (a queue alone must not keep a process
    // alive), so while someone awaits drain() this holds the process open:
    // otherwise it could exit (code 13) while a retry waits to come due.
    const keepAlive = setInterval(() => {}, 60_000);
    try {
      for (;;) {
        await this.#idle();
        // Closed: nothing is delivered any more, so nothing would wake us again.
        if (this.#isClosed()) return;
        // Deliveries settle in microtasks: one that settled just before the
        // wait may pump (start the next delivery) only after the wait ended.
        // Were `next` taken then, it would be that delivery's lease expiry,
        // and drain() would sleep the whole visibility timeout (or, on a
        // manual clock, jump there and abandon a delivery still running).
        if (this.#busy()) continue;
        const next = this.#nextWakeAt();
        if (next === undefined) return;
        const clock = this.#clock as Clock & { advanceTo?: (t: number) => void };
        if (typeof clock.advanceTo === "function") {
          clock.advanceTo(next);
          this.#pumpAll();
        } else {
          // Clamped to the timer limit; the loop re-reads the next due time.
          await new Promise((resolve) => setTimeout(resolve, Math.max(1, timerDelay(next - this.#clock.now()))));
        }
      }
    } finally {
      clearInterval(keepAlive);
    }
  }

  /** No more timer: the queue is closing. */
  cancelTimer(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#rescan) clearTimeout(this.#rescan);
    this.#rescan = undefined;
  }

  /** Lets every `drain()` waiting for the queue to go idle go on. */
  wakeWaiters(): void {
    for (const resolve of this.#idleWaiters) resolve();
    this.#idleWaiters.clear();
  }

  /**
   * The next clock time something happens by itself: a waiting message
   * becomes visible, or a delivery in flight reaches its visibility timeout.
   */
  #nextWakeAt(): number | undefined {
    const now = this.#clock.now();
    let next: number | undefined;
    const consider = (t: number) => {
      if (t > now && (next === undefined || t < next)) next = t;
    };
    const due = (t: number) => {
      if (next === undefined || t < next) next = t;
    };
    for (const s of this.#lanes()) {
      // Time passes between the pump's reading of the clock and this one (a
      // loaded machine can pause between the two): a message that came due
      // meanwhile, with a slot free to take it, is due now, and a lease that
      // expired meanwhile is reaped now. Were either left out, no timer would
      // start it and drain() would wait forever.
      const startable = s.leases.size < s.concurrency && !(s.live && waiting(s.live, now));
      if (startable && waiting(s, now)) due(now);
      const visibleAt = s.nextVisibleAt(now);
      if (visibleAt !== undefined) consider(visibleAt);
      for (const lease of s.leases) due(Math.max(lease.expiresAt, now));
    }
    // A message visible now without a free slot waits for one: it frees when a
    // delivery settles (which pumps) or at a lease's expiry (counted above).
    return next;
  }

  /** After any change: wake drain() waiters when idle, and (real clock) arm a timer for the next due message. */
  afterChange(): void {
    if (!this.#busy()) this.wakeWaiters();
    if (this.#clock.onAdvance || this.#isClosed()) return;
    // Finding the next due time looks at every lane and lease (each lane's
    // earliest message is the top of a heap): at most once per RESCAN_MS, so
    // a burst of deliveries re-arms the timer once, not after every one. A message coming due in
    // between starts at most RESCAN_MS late; the pump after each delivery
    // starts what is due anyway.
    const sinceScan = performance.now() - this.#scannedAt;
    if (sinceScan < RESCAN_MS) {
      this.#rescan ??= setTimeout(() => {
        this.#rescan = undefined;
        this.afterChange();
      }, RESCAN_MS - sinceScan);
      this.#rescan.unref();
      return;
    }
    this.#scannedAt = performance.now();
    const next = this.#nextWakeAt();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (next !== undefined) {
      // Clamped to the timer limit (a longer delay would fire after 1 ms, over
      // and over): firing early pumps nothing, and the pump arms the next one.
      this.#timer = setTimeout(() => this.#pumpAll(), timerDelay(next - this.#clock.now()));
      this.#timer.unref();
    }
  }

  /**
   * A delivery in flight that is not stuck, or a visible message that a free
   * concurrency slot could take now (slots held by stuck deliveries free at
   * their visibility timeout; a replay waits while live messages wait).
   */
  #busy(): boolean {
    for (const lease of this.#inFlight) if (!lease.stuck) return true;
    const now = this.#clock.now();
    for (const s of this.#lanes()) {
      if (s.leases.size >= s.concurrency) continue;
      // A replay lane yielding to live messages that wait for a slot cannot start anything now.
      if (s.live && waiting(s.live, now)) continue;
      if (waiting(s, now)) return true;
    }
    return false;
  }

  /** Resolves once no delivery is in flight (stuck ones aside) and nothing visible waits for a free slot. */
  #idle(): Promise<void> {
    if (!this.#busy()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.add(resolve));
  }
}
