/** Memory readings shared by the benchmarks that report growth (run them with `--expose-gc`). */

/** The process's `gc()` when started with `--expose-gc`, else undefined (readings are then not settled). */
export const gc = (globalThis as { gc?: () => void }).gc;

/** RSS after a full collection (run twice: the first frees what finalizers release), in bytes. */
export async function settledRss(): Promise<number> {
  for (let i = 0; i < 2; i++) {
    gc?.();
    await new Promise((resolve) => setImmediate(resolve));
  }
  return process.memoryUsage().rss;
}
