/**
 * Batched work transactions (#23): deliveries of one consumer that arrive
 * together run in one transaction — one multi-row fence insert, a SAVEPOINT
 * per job, one COMMIT — on the same engine as a single job
 * (`work-transaction.ts`: the same opening, bounds, isolation level, gate,
 * commit proof and connection ending; a batch of one *is* a single-job run).
 *
 * Every rule of SPEC §4 holds per job:
 * - **Fence and work commit together, or neither.** A job's fence is written
 *   by the batch's insert; a job that does not commit (its handler threw, or
 *   swallowed the error of a failed statement, or it has a pending dead
 *   letter) has its savepoint rolled back *and its fence row deleted* in the
 *   same transaction before COMMIT; a batch that cannot do that commits
 *   nothing.
 * - **No handler can commit another job's fence.** The fences of the whole
 *   batch are written before the first handler runs, so a COMMIT sent
 *   through a handler's `tx` would mark jobs done that never ran: each
 *   handler's gate refuses transaction control (`transaction-control.ts`).
 * - **Duplicates**, inside one batch too: a batch never holds two deliveries
 *   of one job (the second starts the next batch, whose fence insert waits
 *   for this one and finds the committed fence); a conflict is a duplicate.
 * - **Ordering keys**: a batch never holds two jobs of one key, and takes its
 *   locks in one order (by their 64-bit hash), then its fences in one order
 *   (by job id): locks before fences in every transaction, each in a fixed
 *   order, so batches never wait on each other in a cycle (graphile-worker
 *   #621: batching must not break a named queue's serial guarantee).
 * - **Failure classes** are the handler's own: a throw is classified as in a
 *   single job (retry / rate-limited / dead letter); the other jobs commit.
 *   A job whose handler ran but whose batch was rolled back through another
 *   job (that one ran out the batch's budget, or the connection broke) spends
 *   no attempt (`BatchAbortedError`: deferred); a lost or unproven COMMIT is
 *   every committed job's transient failure, as it is a single job's.
 * - **Bounds**: the batch shares one budget of the consumer's `timeoutMs`
 *   from asking for a connection to COMMIT; a job waits at most `maxWaitMs`
 *   for its batch to form, which `deliveryBoundMs` adds.
 *
 * `concurrent` batches (`runConcurrently`) run the handlers at once with no
 * savepoints, their queries pipelined: they commit only when every handler
 * returned, none was refused, and the transaction is healthy; anything else
 * rolls the whole batch back and runs it again the sequential way above, so
 * each job still gets the outcome it would have had alone. Savepoint
 * statements are refused there (`ConcurrentGate`): savepoints are a stack of
 * the transaction's, shared by handlers running at once.
 */
import { InvalidConfigError } from "../errors.ts";
import { Collector, type Job, Suspects } from "./batch-collector.ts";
import {
  FENCES_SQL,
  FENCES_XID_SQL,
  LETTERS_SQL,
  LOCKS_SQL,
  lockedLetterCheck,
  RELEASE,
  ROLLBACK_TO,
  SAVEPOINT,
  UNFENCE_SQL,
} from "./batch-sql.ts";
import { type Answer, type DriverConnection, Gate, type Statement, sendInOrder } from "./driver.ts";
import {
  BatchAbortedError,
  HandlerTimeoutError,
  isInstance,
  RolledBackAtCommitError,
  WorkNotStartedError,
} from "./errors.ts";
import { savepointIn } from "./transaction-control.ts";
import type { AnyPgDatabase } from "./types.ts";
import {
  acquireWithin,
  commitWork,
  DEFAULT_TIMEOUT_MS,
  Deadline,
  driverFor,
  finish,
  handlerTransaction,
  letterOutcome,
  Openings,
  openWork,
  type RunEnd,
  type RunInWorkTransaction,
  RunSignal,
  runHandler,
  runOn,
  StartTimeoutError,
  singleRunner,
  type WorkOutcome,
  type WorkTransactionOptions,
} from "./work-transaction.ts";

/** How a consumer's deliveries are gathered into one work transaction. */
export interface BatchOptions {
  /** Most jobs in one transaction (1: no batching). */
  readonly maxSize: number;
  /** Longest a delivery waits for others to join its batch, in ms (0: only those that arrive in the same turn). */
  readonly maxWaitMs: number;
  /**
   * Run the batch's handlers at the same time, their queries pipelined on the
   * one connection, with no savepoint per job: one round trip for the whole
   * batch's handlers instead of one per job. The handlers share one
   * transaction at once, so a handler must not read a row, then write what it
   * read, where another job of the batch may write the same row (a lost
   * update): write in one statement (`set points = points + $1`, an insert).
   * If any handler throws, refuses, or leaves a failed statement, the batch
   * is rolled back and run again the sequential way (a savepoint per job),
   * which classifies each job; a handler may run twice then, its first run
   * undone. Nested `tx.transaction()` savepoints are refused in the
   * concurrent run (savepoints are the transaction's, not the handler's) and
   * work in the sequential one. Only where the connection pipelines
   * (postgres.js with `pipeline` on); elsewhere handlers run one after
   * another, as without it. @default false
   */
  readonly concurrent?: boolean;
}

/** Largest `maxSize`: a savepoint per job is a subtransaction, and past 64 Postgres spills them to disk. */
export const MAX_BATCH_SIZE = 64;
/** Longest `maxWaitMs`: a batch trades this much latency for throughput. */
export const MAX_BATCH_WAIT_MS = 1_000;

/** Checks batch options; a clear error names the consumer. */
export function checkBatchOptions(batch: unknown, owner: string): BatchOptions | undefined {
  if (batch === undefined) return undefined;
  const { maxSize, maxWaitMs } = (batch ?? {}) as Partial<BatchOptions>;
  if (!(Number.isInteger(maxSize) && (maxSize as number) >= 1 && (maxSize as number) <= MAX_BATCH_SIZE)) {
    throw new InvalidConfigError(
      `${owner}: batch.maxSize must be a whole number of jobs from 1 to ${MAX_BATCH_SIZE}, got ${String(maxSize)}`,
    );
  }
  if (!(Number.isFinite(maxWaitMs) && (maxWaitMs as number) >= 0 && (maxWaitMs as number) <= MAX_BATCH_WAIT_MS)) {
    throw new InvalidConfigError(
      `${owner}: batch.maxWaitMs must be a number of milliseconds from 0 to ${MAX_BATCH_WAIT_MS}, got ${String(maxWaitMs)}`,
    );
  }
  const { concurrent } = batch as Partial<BatchOptions>;
  if (concurrent !== undefined && typeof concurrent !== "boolean") {
    throw new InvalidConfigError(`${owner}: batch.concurrent must be true or false, got ${String(concurrent)}`);
  }
  return Object.freeze({
    maxSize: maxSize as number,
    maxWaitMs: maxWaitMs as number,
    ...(concurrent ? { concurrent: true } : {}),
  });
}

/**
 * A work-transaction runner with the same contract as `workTransactionFor`'s,
 * whose calls are gathered into batches of up to `maxSize` jobs of one
 * consumer, for up to `maxWaitMs`.
 */
export function batchedWorkTransactionFor(
  db: AnyPgDatabase,
  options: WorkTransactionOptions & { readonly batch: BatchOptions },
): RunInWorkTransaction {
  const batch = checkBatchOptions(options.batch, "batch") as BatchOptions;
  const driver = driverFor(db, options);
  const openings = new Openings();
  const single = singleRunner(driver, openings);
  const suspects = new Suspects();
  const alone = new Suspects();
  const run = async (jobs: readonly Job[]): Promise<void> => {
    const first = jobs[0] as Job;
    const timeoutMs = first.target.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const deadline = new Deadline(timeoutMs);
    const settled: Settled[] = [];
    try {
      const conn = await acquireWithin(driver, deadline, timeoutMs);
      if (jobs.length === 1 || !conn.batches) {
        // One job per transaction: this one on this connection, any others
        // each on its own (a connection that cannot undo one job alone).
        const alone = (job: Job, i: number) => async () => {
          settled[i] = await single(job.target, job.work).then(
            (outcome): Settled => ({ ok: true, outcome }),
            (error: unknown): Settled => ({ ok: false, error }),
          );
        };
        const others = Promise.all(jobs.slice(1).map((job, i) => alone(job, i + 1)()));
        settled[0] = await runOn(driver, conn, openings, deadline, timeoutMs, first.target, first.work).then(
          (outcome): Settled => ({ ok: true, outcome }),
          (error: unknown): Settled => ({ ok: false, error }),
        );
        await others;
      } else {
        const concurrent = batch.concurrent === true;
        await runBatchOn({ driver, conn, openings, deadline, timeoutMs, concurrent, suspects, alone }, jobs, settled);
      }
    } catch (error) {
      for (let i = 0; i < jobs.length; i++) settled[i] ??= { ok: false, error };
    } finally {
      deadline.end();
    }
    jobs.forEach((job, i) => {
      const result = settled[i] ?? { ok: false, error: new WorkNotStartedError("the batch ended without an outcome") };
      if (result.ok) job.resolve(result.outcome);
      else job.reject(result.error);
    });
  };
  const collector = new Collector(batch, run, alone);
  return (target, work) => collector.add(target, work);
}

type Settled = { readonly ok: true; readonly outcome: WorkOutcome } | { readonly ok: false; readonly error: unknown };

interface Run {
  readonly driver: ReturnType<typeof driverFor>;
  readonly conn: DriverConnection;
  readonly openings: Openings;
  readonly deadline: Deadline;
  readonly timeoutMs: number;
  readonly concurrent: boolean;
  readonly suspects: Suspects;
  /**
   * Jobs whose next delivery runs in a transaction of its own: a batch went
   * wrong after one of its handlers returned (a statement it sent without
   * awaiting failed later) and which one is not known; alone, the fault is
   * charged to the job that made it.
   */
  readonly alone: Suspects;
}

/** A batch of two or more jobs of one consumer on one connection; fills `settled` (one entry per job). */
async function runBatchOn(run: Run, jobs: readonly Job[], settled: Settled[]): Promise<void> {
  const { driver, conn, deadline, timeoutMs } = run;
  const end: RunEnd = { state: "rollback" };
  const consumer = (jobs[0] as Job).target.consumer;
  const committers: number[] = [];
  try {
    // A batch with a suspect runs one handler after another, with the whole budget.
    const concurrent = run.concurrent && conn.pipelines && !jobs.some((j) => run.suspects.has(j.id));
    for (const job of jobs) run.suspects.delete(job.id);
    let opened = await openBatch(run, jobs, settled, end);
    if (concurrent && opened.toRun.length > 1) {
      const stragglers = await runConcurrently(run, jobs, opened, settled, end);
      if (stragglers === true) return;
      // Rolled back: the batch runs again from BEGIN, one handler after another.
      end.state = "rollback";
      end.commitSent = false;
      settled.length = 0;
      opened = await openBatch(run, jobs, settled, end).catch((error: unknown) => {
        // The budget went before the batch could open again (spent waiting
        // behind a straggler's statement): the stragglers are suspects.
        if (deadline.spent) suspect(run, jobs, stragglers);
        throw error;
      });
    }
    const { xid, unfence, toRun } = opened;

    for (const i of toRun) {
      const job = jobs[i] as Job;
      if (deadline.spent) {
        // The budget went before this job's turn: it never started.
        settled[i] = { ok: false, error: new WorkNotStartedError(new StartTimeoutError(timeoutMs)) };
        unfence.push(job.id);
        continue;
      }
      // Sent ahead of the handler's first query (drivers keep a
      // connection's order): no round trip of its own; it has answered by
      // the time the handler's queries have. A job's savepoint is not
      // released: the next one nests inside it (ROLLBACK TO undoes the most
      // recent of the name, the job's own), and COMMIT ends them all.
      const savepoint = conn.query({ text: SAVEPOINT });
      savepoint.catch(noop);
      let failure: { error: unknown } | undefined;
      try {
        await runHandler(driver, conn, new Gate(), deadline, timeoutMs, job.work, end);
      } catch (error) {
        failure = { error };
      }
      if (destroyed(end)) {
        // Past the budget: the connection is gone, and every job's work with
        // it. No job of a batch has the budget to itself: the opening waited
        // for every job's ordering lock and fence (a key another batch holds
        // for all of that batch, longer than for its one job), and earlier
        // handlers of this pass, or a concurrent run before it, spent part of
        // it. So this one may be late through no fault of its own, or through
        // a statement an earlier handler left running: it spends no attempt,
        // and every job of the batch runs alone next time, with a budget of
        // its own, where a job that is slow itself is the one charged (was:
        // charged here when it was the first of its pass, whatever the
        // opening had waited for; before that, whichever job ran out, so a
        // batch whose jobs together outlast the budget never committed, and
        // dead-lettered an innocent job).
        if (isInstance(failure?.error, HandlerTimeoutError)) {
          isolate(run, jobs);
          settled[i] = { ok: false, error: new BatchAbortedError(failure.error) };
        } else {
          settled[i] = { ok: false, error: failure?.error };
        }
        throw new BatchAbortedError(failure?.error);
      }
      // A failed SAVEPOINT: a statement of an earlier job failed after its
      // handler returned (one it did not await). Nothing is known to be
      // clean: the whole batch is undone, and each job runs alone next time.
      await within(run, savepoint, end).catch((error: unknown) => {
        if (!destroyed(end)) isolate(run, jobs);
        throw new BatchAbortedError(error);
      });
      if (failure === undefined) {
        const health = await cleanAfter(run, jobs, end);
        if (health.clean) {
          committers.push(i);
          continue;
        }
        // The handler caught the error of a failed statement: nothing of
        // its work may commit, and the job is retried.
        failure = {
          error: new Error(
            "the job's work was rolled back: a statement failed inside it and the handler caught its error",
            { cause: health.error },
          ),
        };
      }
      // This job alone is undone; if even that fails, the batch is.
      const undone = Promise.all([conn.query({ text: ROLLBACK_TO }), conn.query({ text: RELEASE })]);
      await within(run, undone, end).catch((error: unknown) => {
        settled[i] = { ok: false, error: failure?.error };
        throw new BatchAbortedError(error);
      });
      settled[i] = { ok: false, error: failure.error };
      unfence.push(job.id);
    }
    // A budget spent before every job's turn came commits nothing (the jobs
    // that ran spend no attempt).
    if (deadline.spent) throw new BatchAbortedError(new HandlerTimeoutError(timeoutMs));
    if (committers.length === 0) return; // nothing to commit: rolled back by finish()
    if (unfence.length > 0) {
      await within(run, conn.query({ text: UNFENCE_SQL, params: [unfence, consumer] }), end).catch((error: unknown) => {
        // As at COMMIT below: a statement a handler did not await failed
        // after its status was read, and whose it was is not known.
        if (!destroyed(end)) isolate(run, jobs);
        throw new BatchAbortedError(error);
      });
    }
    try {
      await commitWork(conn, deadline, timeoutMs, xid, end);
    } catch (error) {
      if (error instanceof RolledBackAtCommitError) {
        // Nothing committed: a statement a handler did not await failed
        // after the status was read, or a deferred constraint fired right
        // before COMMIT failed, and whose work it was is not known. No job
        // is charged for it here; each runs alone next time, where it is.
        isolate(run, jobs);
        throw error;
      }
      if (!end.commitSent) {
        // COMMIT never went (the commit check found no answer within the
        // budget, or another transaction state; the budget went first):
        // nothing committed, and whose work made the batch late — a slow
        // deferred trigger, a statement left running — is not known. No
        // job is charged; each runs alone next time, where it is (as in a
        // concurrent run, which comes here for its rerun).
        isolate(run, jobs);
        throw new BatchAbortedError(error);
      }
      // COMMIT went and its answer is an error, late or lost: every committed
      // job's failure, as for a single job (the fence decides on retry).
      for (const i of committers) settled[i] = { ok: false, error };
      return;
    }
    for (const i of committers) settled[i] = { ok: true, outcome: { status: "committed" } };
  } catch (error) {
    // The batch is over before COMMIT: work that ran is undone through no
    // failure of its own (no attempt spent); jobs not reached never started.
    const aborted = error instanceof WorkNotStartedError ? error : new BatchAbortedError(error);
    for (const i of committers) settled[i] ??= { ok: false, error: aborted };
    for (let i = 0; i < jobs.length; i++) settled[i] ??= { ok: false, error: notStarted(aborted) };
  } finally {
    await finish(conn, end.state);
  }
}

/** An opened batch: the fences written, and what each job does next. */
interface Opened {
  /** The transaction id the fences were written in (drivers without a transaction status). */
  readonly xid: unknown;
  /** Jobs whose fence row goes before COMMIT (a pending letter; later, a job that does not commit). */
  readonly unfence: string[];
  /** Jobs whose handler runs, in the batch's order. */
  readonly toRun: readonly number[];
}

/**
 * BEGIN, the batch's ordering locks and its fences; a job whose fence
 * existed is settled as a duplicate, one with a pending letter as dead-lettered.
 */
async function openBatch(run: Run, jobs: readonly Job[], settled: Settled[], end: RunEnd): Promise<Opened> {
  const { conn, openings, deadline, timeoutMs } = run;
  const keys = [...new Set(jobs.flatMap((j) => (j.target.lockKey === undefined ? [] : [j.target.lockKey])))];
  const statements: Statement[] = [];
  if (keys.length > 0) statements.push({ text: LOCKS_SQL, params: [keys] });
  const params = [jobs.map((j) => j.id), (jobs[0] as Job).target.consumer];
  const fencesAt = statements.push({ text: conn.provesByStatus ? FENCES_SQL : FENCES_XID_SQL, params }) - 1;
  statements.push({ text: LETTERS_SQL, params });
  const answers = await openWork(conn, openings, deadline, timeoutMs, statements, end);
  const rows = answers[fencesAt] ?? [];
  let letterRows = answers[fencesAt + 1] ?? [];
  // A key found: read again, waiting for a change of it in flight (LOCKED_LETTERS_SQL).
  if (letterRows.length > 0) letterRows = await lockedLetters(run, params, end);
  const fences = new Map<string, Answer[number]>();
  for (const row of rows) fences.set(String(row["job_id"]), row);
  const letters = new Map<string, unknown>();
  for (const row of letterRows) letters.set(String(row["job_id"]), row["detail"]);
  let xid: unknown;
  const unfence: string[] = [];
  const toRun: number[] = [];
  jobs.forEach((job, i) => {
    const fence = fences.get(job.id);
    const letter = letters.get(job.id);
    if (fence === undefined) {
      settled[i] = { ok: true, outcome: { status: "duplicate" } };
    } else if (typeof letter === "string") {
      // A pending letter: the handler does not run, and the fence row goes.
      settled[i] = { ok: true, outcome: letterOutcome(letter) };
      unfence.push(job.id);
    } else {
      xid = fence["xid"];
      toRun.push(i);
    }
  });
  return { xid, unfence, toRun };
}

/**
 * The batch's pending letters read again FOR SHARE, in a savepoint rolled
 * back at once (`lockedLetterCheck`): only when the opening's read found a
 * key. Part of the opening: bounded by the budget (past it the connection is
 * destroyed), and any failure defers the batch (WorkNotStartedError).
 */
async function lockedLetters(run: Run, params: readonly unknown[], end: RunEnd): Promise<Answer> {
  const { conn, deadline, timeoutMs } = run;
  const checks = lockedLetterCheck(params);
  try {
    const sent = conn.pipelines
      ? Promise.allSettled(checks.map((check) => conn.query(check)))
      : sendInOrder(checks, (check) => conn.query(check));
    const settled = await deadline.within(sent, () => {
      end.state = "destroy";
      conn.destroy();
      return new StartTimeoutError(timeoutMs);
    });
    for (const s of settled) if (s.status === "rejected") throw s.reason;
    return (settled[1] as PromiseFulfilledResult<Answer>).value;
  } catch (error) {
    throw new WorkNotStartedError(error);
  }
}

/**
 * The handlers of an opened batch at the same time, with no savepoints
 * (`BatchOptions.concurrent`). True when every job that ran is settled
 * (committed, or the commit's failure: once COMMIT went, every job's);
 * otherwise nothing committed and the connection is idle again — a handler
 * threw, refused, or left a failed statement, even one that failed only at
 * COMMIT — so the batch must run again the sequential way, which classifies
 * each job on its own; the answer is then the jobs still running at the
 * first failure (suspects if the budget goes before the batch opens again).
 * Throws (the batch aborted, no attempt spent) when the budget ran out or
 * the connection broke: with handlers at once, queued behind each other's
 * queries, the one that made the batch late is not known, so the jobs still
 * running become suspects whose next batch runs one handler after another.
 */
async function runConcurrently(
  run: Run,
  jobs: readonly Job[],
  opened: Opened,
  settled: Settled[],
  end: RunEnd,
): Promise<true | number[]> {
  const { driver, conn, deadline, timeoutMs } = run;
  const { toRun, unfence, xid } = opened;
  const gates = toRun.map(() => new ConcurrentGate());
  const signals = toRun.map(() => new RunSignal());
  const running = new Set<number>(toRun);
  // The first failure ends the concurrent run at once: every gate closes (a
  // handler still running can send nothing more), every signal aborts, and
  // the rollback and the sequential run get what is left of the budget.
  let failed: (() => void) | undefined;
  // The jobs whose handlers were still running at the first failure: their
  // statements may still hold the connection, and the ROLLBACK waits behind
  // them. If the budget goes in that wait, they are the suspects.
  let stragglers: number[] = [];
  const firstFailure = new Promise<false>((resolve) => {
    failed = () => {
      stragglers = [...running];
      stop(gates, signals, new BatchRerunError());
      resolve(false);
    };
  });
  const works = toRun.map((i, k) => {
    const gate = gates[k] as ConcurrentGate;
    const work = (async () => (jobs[i] as Job).work(handlerTransaction(driver, conn, gate), signals[k] as RunSignal))();
    return work.then(
      () => {
        gate.close();
        running.delete(i);
        if (gate.refused === undefined) return true;
        failed?.();
        return false;
      },
      () => {
        gate.close();
        running.delete(i);
        failed?.();
        return false;
      },
    );
  });
  let allOk: boolean;
  let late: number[] = [];
  try {
    const all = Promise.all(works).then((oks) => oks.every(Boolean));
    allOk = await deadline.within(Promise.race([all, firstFailure]), () => {
      // Read before the connection goes: its queries' failures end handlers.
      late = [...running];
      const error = new HandlerTimeoutError(timeoutMs);
      stop(gates, signals, error);
      end.state = "destroy";
      conn.destroy();
      return error;
    });
  } catch (error) {
    suspect(run, jobs, late);
    throw new BatchAbortedError(error);
  } finally {
    for (const gate of gates) gate.close();
  }
  if (allOk && conn.transactionStatus() === "T") {
    const consumer = (jobs[0] as Job).target.consumer;
    try {
      if (unfence.length > 0) await within(run, conn.query({ text: UNFENCE_SQL, params: [unfence, consumer] }), end);
      await commitWork(conn, deadline, timeoutMs, xid, end);
    } catch (error) {
      if (error instanceof RolledBackAtCommitError) {
        // COMMIT answered ROLLBACK: a statement a handler did not await failed
        // after the status was read. Nothing committed and the connection is
        // idle: run again, one handler after another, which finds it.
        if (error.cause === undefined && end.state === "idle") return [];
        if (error.cause === undefined && end.state === "rollback") return rollBack(run, end).then(() => []);
        // A deferred constraint fired right before COMMIT failed: nothing
        // committed, and no run of this batch can tell whose work broke it.
        // No job is charged; each runs alone next time, where it is.
        isolate(run, jobs);
        throw new BatchAbortedError(error);
      }
      if (!end.commitSent) {
        // The unfence or the budget failed before COMMIT: nothing committed.
        if (destroyed(end)) throw new BatchAbortedError(error);
        if (end.state === "rollback") return rollBack(run, end).then(() => []);
      }
      // COMMIT went and its answer is an error, late or lost: every job's
      // failure, as for a single job (an attempt spent; the fence decides on retry).
      for (const i of toRun) settled[i] = { ok: false, error };
      return true;
    }
    for (const i of toRun) settled[i] = { ok: true, outcome: { status: "committed" } };
    return true;
  }
  return rollBack(run, end).then(
    () => stragglers,
    (error: unknown) => {
      suspect(run, jobs, stragglers);
      throw error;
    },
  );
}

/** Jobs of the batch (by index) whose next batch runs one handler after another, with the whole budget. */
function suspect(run: Run, jobs: readonly Job[], indexes: readonly number[]): void {
  for (const i of indexes) run.suspects.add((jobs[i] as Job).id);
}

/** Every job of the batch runs in a transaction of its own next time (`Run.alone`). */
function isolate(run: Run, jobs: readonly Job[]): void {
  for (const job of jobs) run.alone.add(job.id);
}

/** Closes every gate and aborts every handler's signal with `reason`. */
function stop(gates: readonly Gate[], signals: readonly RunSignal[], reason: Error): void {
  for (const gate of gates) gate.close();
  for (const signal of signals) signal.controller().abort(reason);
}

/** ROLLBACK of a concurrent run that failed, answered: false (run again); else the batch aborts. */
async function rollBack(run: Run, end: RunEnd): Promise<false> {
  const answer = await within(run, run.conn.rollback(), end).catch((error: unknown) => {
    throw new BatchAbortedError(error);
  });
  if (answer !== "ROLLBACK") {
    end.state = "destroy";
    throw new BatchAbortedError(new Error(`ROLLBACK answered ${String(answer)}`));
  }
  return false;
}

/** The reason a concurrent batch's other handlers are stopped: one failed, and the batch runs again one handler after another. */
export class BatchRerunError extends Error {
  constructor() {
    super(
      "another handler of this concurrent batch failed: the batch is rolled back and runs again one handler after another",
    );
    this.name = "BatchRerunError";
  }
}

/**
 * A handler's gate in a concurrent batch: also refuses savepoints, and
 * remembers a refusal, so a handler that caught the error still sends its
 * job to the sequential run.
 */
class ConcurrentGate extends Gate {
  refused: Error | undefined;
  override check(text?: unknown): void {
    try {
      super.check(text);
      const savepoint = typeof text === "string" ? savepointIn(text) : undefined;
      if (savepoint !== undefined) throw new BatchSavepointError(savepoint);
    } catch (error) {
      this.refused ??= error as Error;
      throw error;
    }
  }
}

/** A handler of a concurrent batch sent a savepoint statement: run again the sequential way, where it may. */
export class BatchSavepointError extends Error {
  constructor(statement: string) {
    super(
      `${statement.toUpperCase()} refused in a concurrent batch (its handlers share the transaction's savepoints); the batch runs again one handler after another, where it is allowed`,
    );
    this.name = "BatchSavepointError";
  }
}

/**
 * Whether the transaction is healthy after a handler returned. From the
 * session's own status where the connection reports it (no round trip: 'E'
 * is a failed statement the handler caught); else RELEASE SAVEPOINT answers
 * it (one round trip).
 */
async function cleanAfter(
  run: Run,
  jobs: readonly Job[],
  end: RunEnd,
): Promise<{ readonly clean: true } | { readonly clean: false; readonly error: unknown }> {
  const { conn } = run;
  if (conn.provesByStatus) {
    const status = conn.transactionStatus();
    if (status === "T") return { clean: true };
    if (status === "E") return { clean: false, error: new Error("the transaction is in a failed state (25P02)") };
    throw new BatchAbortedError(new Error("the connection closed, or the transaction ended, while a handler ran"));
  }
  try {
    await within(run, conn.query({ text: RELEASE }), end);
    return { clean: true };
  } catch (error) {
    if (destroyed(end)) {
      // The budget went while RELEASE waited, behind a statement the handler
      // left running: each job runs alone next time, where that one is charged.
      isolate(run, jobs);
      throw new BatchAbortedError(error);
    }
    return { clean: false, error };
  }
}

/** A wait on the connection within the batch's budget; past it the connection is destroyed. */
function within<T>(run: Run, work: Promise<T>, end: RunEnd): Promise<T> {
  return run.deadline.within(work, () => {
    end.state = "destroy";
    run.conn.destroy();
    return new HandlerTimeoutError(run.timeoutMs);
  });
}

/** Read through a call: the run's end state changes in callbacks the compiler cannot follow. */
function destroyed(end: RunEnd): boolean {
  return end.state === "destroy";
}

function notStarted(error: WorkNotStartedError): WorkNotStartedError {
  return error instanceof BatchAbortedError ? new WorkNotStartedError(error.cause ?? error) : error;
}

const noop = () => {};
