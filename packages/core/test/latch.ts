/** A promise a test awaits and the call that settles it (Promise.withResolvers needs Node 22). */
export interface Latch {
  /** Settles once `open()` is called. */
  readonly opened: Promise<void>;
  readonly open: () => void;
}

export function latch(): Latch {
  let open = () => {};
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { opened, open };
}
