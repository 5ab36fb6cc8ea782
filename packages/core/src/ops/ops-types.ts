/**
 * The dead-letter operations' dependencies and result types (moved out of
 * operations.ts).
 */
import type { Clock } from "../clock.ts";
import type { DeadLetterRow } from "../db/schema.ts";
import type { AnyPgDatabase } from "../db/types.ts";
import type { Envelope } from "../envelope.ts";
import type { QueuePort, ReplayLanePort } from "../queue-port.ts";
import type { ReplayRoute, ReplayTransport } from "./routes.ts";
import type { StrainMonitor } from "./strain.ts";

/** Where replay and failed-again counts go (OpenTelemetry in production). */
export interface OpsMetricsPort {
  /** One letter republished. */
  replayed(attributes: { readonly queue: string; readonly consumer: string }): void;
  /** Jobs replayed by a batch that failed again, as the batch runner finds them. */
  failedAgain(count: number): void;
  /**
   * A batch's recovery report, after each run of it (#21 item 7): what it
   * replayed and what became of those jobs. Optional: ports written before
   * it report nothing.
   */
  batchRecovery?(report: BatchRecoveryReport): void;
}

/** What a batch replayed and what became of it, when a run of it ends. */
export interface BatchRecoveryReport {
  readonly batchId: string;
  readonly status: string;
  readonly replayed: number;
  readonly succeeded: number;
  readonly failedAgain: number;
  /** Replayed jobs not resolved yet (still being retried, or in the transport). */
  readonly inFlight: number;
  readonly duplicates: number;
  /** From its start until its last replayed job resolved; null until it recovered. */
  readonly timeToRecoveryMs: number | null;
}
export const noopOpsMetrics: OpsMetricsPort = { replayed() {}, failedAgain() {} };

export interface OpsDeps {
  readonly db: AnyPgDatabase;
  /**
   * Where replays are published: the platform transport with the routes it
   * delivers (see routes.ts). Give this, or `queue`.
   */
  readonly replay?: ReplayTransport;
  /**
   * A queue adapter to publish replays through, on its replay lane: the
   * in-process adapter routes to the consumers subscribed to it; any other
   * needs `routes`. Ignored when `replay` is given.
   */
  readonly queue?: QueuePort & Partial<ReplayLanePort>;
  /** With `queue`: the registry of routes modules contributed. @default what an in-process queue has subscribed; none otherwise */
  readonly routes?: readonly ReplayRoute[];
  /**
   * Most letters one requester may replay without a second operator's
   * approval over `approvalWindowMs`: direct replays and unapproved batches
   * together (SPEC §5). `Number.MAX_SAFE_INTEGER` (or more) turns the
   * library's count off (a trusted service's replays); for a login the
   * database does not trust, its own ceiling of 100 still holds. @default 100
   */
  readonly approvalThreshold?: number;
  /** The rolling window of `approvalThreshold`. @default 86_400_000 (24 h) */
  readonly approvalWindowMs?: number;
  /** @default no metrics */
  readonly metrics?: OpsMetricsPort;
  /** @default the system clock */
  readonly clock?: Clock;
  /** Most letters one direct `replay()` call may take; more need a batch. @default 100 */
  readonly maxDirectReplay?: number;
  /**
   * Longest one replay's publish may take (the letter's row is locked while
   * it runs): no answer in time is not stored, the replay rolls back and the
   * letter stays pending (a copy stored after all finds it pending and does
   * not run). @default 10_000
   */
  readonly publishTimeoutMs?: number;
  /**
   * What the consumers report of their strain (rate-limited outcomes, handler
   * p95), where they run: a batch pauses when it passes a multiple of the
   * baseline before it (#21 item 5). @default none: not checked
   */
  readonly strain?: StrainMonitor;
}

export type DeadLetterSummary = Omit<DeadLetterRow, "payload">;

export interface Page<T> {
  readonly items: T[];
  /** Pass back as `cursor` for the next page; null on the last one. */
  readonly nextCursor: string | null;
}

export interface DeadLetterDetail extends DeadLetterRow {
  /** The payload decoded as text (base64 payloads decoded), and as an envelope when it is one. */
  readonly payloadText: string;
  readonly envelope: Envelope | null;
  /** Other dead letters of the same job and consumer: earlier failures and failures after replays. */
  readonly related: DeadLetterSummary[];
  /**
   * Copies of this job that arrived with other bytes than `payload` while the
   * letter was pending (`core.dead_letter_payloads`), first seen first: each
   * distinct payload's evidence, exactly as received.
   */
  readonly otherPayloads: OtherPayload[];
  /** Audit entries that name this letter or its batch, oldest first: the first `HISTORY_IN_DETAIL` of them. */
  readonly history: AuditEntry[];
  /** Pass to `history(id, { cursor })` for the entries after these; null when these are all. */
  readonly historyNextCursor: string | null;
}

/** One other payload of a letter (`core.dead_letter_payloads`). */
export interface OtherPayload {
  readonly payloadSha256: string;
  readonly payload: string;
  readonly payloadEncoding: string;
  /** The payload decoded as text (base64 payloads decoded). */
  readonly payloadText: string;
  readonly lastError: string;
  readonly occurrences: number;
  readonly firstSeenAt: Date;
  readonly lastSeenAt: Date;
}

/** One entry of `core.ops_audit`, as a letter's history shows it. */
export interface AuditEntry {
  readonly id: string;
  readonly at: Date;
  readonly operator: string;
  readonly action: string;
  readonly result: string;
  readonly detail: string | null;
}

/** A letter created after a replay of its job and consumer: the replayed job failed again. */
export interface ReplayFailure extends DeadLetterSummary {
  /** The replayed letter whose replay this failure followed (the latest replay before it). */
  readonly replayedFrom: string;
  /** The batch that replayed it; null for a direct replay. */
  readonly batchId: string | null;
}

/** History entries `get` includes; the rest through `history()`. */
export const HISTORY_IN_DETAIL = 100;
/** Audit entries younger than this are never pruned, whatever the retention asked. */
export const MIN_AUDIT_RETENTION_DAYS = 30;
/** The audit retention of `pnpm ops audit prune` when none is given. */
export const DEFAULT_AUDIT_RETENTION_DAYS = 400;

/** Per id, what an action did. */
export type ActionOutcome =
  | "discarded"
  | "replayed"
  | "not_found"
  | "not_pending"
  | "not_replayable"
  | "not_routable"
  | "needs_approval"
  | "failed";
export interface ActionReport {
  readonly results: { readonly id: string; readonly outcome: ActionOutcome; readonly detail?: string }[];
  readonly counts: Partial<Record<ActionOutcome, number>>;
}
