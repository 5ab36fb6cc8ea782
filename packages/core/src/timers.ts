/**
 * Every wait of the library goes through these (#18 item 5). Node's
 * setTimeout and setInterval take at most 2^31 − 1 ms; a longer delay is
 * replaced by 1 ms (with a warning), so a wait on something due in 30 days
 * would fire at once, over and over, and a pacing wait longer than that
 * would not wait at all. A clamped timer fires early by design: whoever it
 * wakes re-checks its own due time and waits again.
 */

/** The longest delay setTimeout honours. */
export const MAX_TIMER_DELAY_MS = 2_147_483_647;

/** A delay setTimeout honours for a wait of `ms`: in [0, MAX_TIMER_DELAY_MS] (NaN is 0). */
export function timerDelay(ms: number): number {
  if (!(ms > 0)) return 0;
  return Math.min(ms, MAX_TIMER_DELAY_MS);
}

/**
 * Resolves once `now()` reaches `dueAt`, however far ahead that is: each
 * timer waits at most the timer limit, and the due time is checked again
 * when it fires. Resolves at once when `signal` aborts.
 */
export function sleepUntil(dueAt: number, now: () => number = Date.now, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const arm = () => {
      const left = dueAt - now();
      if (!(left > 0)) return done();
      timer = setTimeout(arm, timerDelay(left));
    };
    signal?.addEventListener("abort", done, { once: true });
    arm();
  });
}

/** `sleepUntil(now + ms)`. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return sleepUntil(Date.now() + ms, Date.now, signal);
}

/** Throws a RangeError naming `what` unless `ms` is a positive delay a timer honours (for setInterval periods). */
export function checkTimerPeriod(what: string, ms: number): number {
  if (!(Number.isFinite(ms) && ms > 0 && ms <= MAX_TIMER_DELAY_MS)) {
    throw new RangeError(
      `${what} must be a number of milliseconds from 1 to ${MAX_TIMER_DELAY_MS} (about 24.8 days), got ${ms}`,
    );
  }
  return ms;
}

/**
 * `work`'s result if it comes within `ms`, else the error `expired` returns
 * (`work` goes on; its late result or error is dropped). For work that
 * cannot be cancelled: a dead letter's writes on their own transaction, a
 * transport's send.
 */
export function withinMs<T>(work: Promise<T>, ms: number, expired: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(expired()), ms);
  });
  work.catch(() => {});
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
