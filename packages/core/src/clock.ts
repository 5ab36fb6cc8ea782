/** Time as the queue adapters and the harness see it; tests swap in a manual clock so backoff never sleeps. */
export interface Clock {
  now(): number;
  /** Called after the clock jumps; real clocks never call it. Returns an unsubscribe function. */
  onAdvance?(listener: () => void): () => void;
}

export const systemClock: Clock = { now: () => Date.now() };

export interface ManualClock extends Clock {
  /** Moves time forward by `ms` and wakes whoever waits on it. */
  advance(ms: number): void;
  /** Moves time forward to `epochMs` (never backwards). */
  advanceTo(epochMs: number): void;
  onAdvance(listener: () => void): () => void;
}

/** A clock that only moves when told to. @param start epoch milliseconds @default Date.now() */
export function createManualClock(start: number = Date.now()): ManualClock {
  let current = start;
  const listeners = new Set<() => void>();
  const advanceTo = (epochMs: number) => {
    if (!Number.isFinite(epochMs)) throw new RangeError(`cannot move a clock to ${epochMs}`);
    if (epochMs <= current) return;
    current = epochMs;
    for (const listener of [...listeners]) listener();
  };
  return {
    now: () => current,
    advance: (ms) => advanceTo(current + ms),
    advanceTo,
    onAdvance(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}
