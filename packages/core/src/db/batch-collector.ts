/**
 * How a batched runner gathers its calls (`Collector`), and the job ids a
 * batch marks for their next delivery (`Suspects`).
 */
import type { BatchOptions } from "./batch.ts";
import type { FenceTarget, RunInWorkTransaction, WorkOutcome } from "./work-transaction.ts";

export type Work = Parameters<RunInWorkTransaction>[1];
export interface Job {
  readonly target: FenceTarget;
  readonly id: string;
  readonly work: Work;
  readonly resolve: (outcome: WorkOutcome) => void;
  readonly reject: (error: unknown) => void;
}

/** Gathers calls into batches: full at `maxSize`, due `maxWaitMs` after its first job, cut by a second job of a key. */
export class Collector {
  #forming: Job[] = [];
  readonly #ids = new Set<string>();
  readonly #keys = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  constructor(
    private readonly batch: BatchOptions,
    private readonly run: (jobs: readonly Job[]) => Promise<void>,
    private readonly alone: Suspects,
  ) {}

  add(target: FenceTarget, work: Work): Promise<WorkOutcome> {
    return new Promise<WorkOutcome>((resolve, reject) => {
      const id = target.jobId.toLowerCase();
      if (target.alone === true || this.alone.has(id)) {
        // A transaction of its own, at once (see Run.alone, FenceTarget.alone).
        this.alone.delete(id);
        void this.run([{ target, id, work, resolve, reject }]);
        return;
      }
      const first = this.#forming[0]?.target;
      // Two copies of one job, two jobs of one ordering key, or another
      // consumer's or budget's job never share a batch: the batch forming
      // goes now, and this job starts the next one.
      if (
        first !== undefined &&
        (this.#ids.has(id) ||
          (target.lockKey !== undefined && this.#keys.has(target.lockKey)) ||
          first.consumer !== target.consumer ||
          first.timeoutMs !== target.timeoutMs)
      ) {
        this.#flush();
      }
      this.#forming.push({ target, id, work, resolve, reject });
      this.#ids.add(id);
      if (target.lockKey !== undefined) this.#keys.add(target.lockKey);
      if (this.#forming.length >= this.batch.maxSize) this.#flush();
      else this.#timer ??= setTimeout(() => this.#flush(), this.batch.maxWaitMs);
    });
  }

  #flush(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const jobs = this.#forming;
    this.#forming = [];
    this.#ids.clear();
    this.#keys.clear();
    if (jobs.length > 0) void this.run(jobs);
  }
}

/**
 * Job ids a batch marked for their next delivery (bounded: a worker runs for
 * weeks). `Run.suspects`: jobs whose next batch runs one handler after
 * another with the whole budget — a job still running when a concurrent
 * batch's budget ran out, or one that ran out of the budget the concurrent
 * run left it. Such a job spent no attempt then; the sequential run charges
 * the job that is slow itself. `Run.alone`: see there.
 */
export class Suspects {
  readonly #ids = new Set<string>();
  add(id: string): void {
    if (this.#ids.size >= MAX_SUSPECTS) this.#ids.clear();
    this.#ids.add(id);
  }
  has(id: string): boolean {
    return this.#ids.has(id);
  }
  delete(id: string): void {
    this.#ids.delete(id);
  }
}
const MAX_SUSPECTS = 4_096;
