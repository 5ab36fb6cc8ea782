// `@softcrum/core/ops`: what Softcrum Ops uses to review, replay and discard
// dead letters — the library, its HTTP handlers and the JWT authorizer.
import type { BatchPolicy } from "./batch-input.ts";
import { ReplayBatches } from "./batches.ts";
import { DeadLetterOperations, type OpsDeps } from "./operations.ts";

export type { Authorizer, JwtAuthorizerOptions, Principal } from "./auth.ts";
export { APPROVER_ROLE, jwtAuthorizer, OPERATOR_ROLE } from "./auth.ts";
export type {
  BatchPolicy,
  BatchProgress,
  BatchView,
  CreateBatchInput,
  RunOptions,
  SampleReport,
} from "./batch-input.ts";
export { DEFAULT_BATCH_POLICY } from "./batch-input.ts";
export { RESOLVE_PAGE } from "./batch-resolution.ts";
export { ReplayBatches } from "./batches.ts";
export type { CachedDepthOptions, DepthRow } from "./depth.ts";
export { cachedDepth } from "./depth.ts";
export type { DeadLetterFilter } from "./filters.ts";
export { deadLetterFilterSchema } from "./filters.ts";
export type { OpsHandlerOptions } from "./http.ts";
export { createOpsHandler, MAX_BODY_BYTES } from "./http.ts";
export type {
  ActionOutcome,
  ActionReport,
  AuditEntry,
  BatchRecoveryReport,
  DeadLetterDetail,
  DeadLetterSummary,
  HistoryPageRequest,
  OpsDeps,
  OpsMetricsPort,
  Page,
  PageRequest,
  PruneAuditInput,
  PruneAuditReport,
  ReplayFailure,
  ReplayPageRequest,
} from "./operations.ts";
export {
  DEFAULT_AUDIT_RETENTION_DAYS,
  DeadLetterOperations,
  decodePayload,
  HISTORY_IN_DETAIL,
  MIN_AUDIT_RETENTION_DAYS,
  noopOpsMetrics,
} from "./operations.ts";

export type { InProcessConsumers, ReplayModule, ReplayRoute, ReplayTransport, RouteCheck } from "./routes.ts";
export {
  firstRoutingReplay,
  IN_PROCESS_REPLAY_TIMEOUT_MS,
  inProcessReplay,
  NOT_IN_PROCESS,
  ReplayNotAppliedError,
  registeredReplay,
  replayRouteOf,
  replayTransportFor,
} from "./routes.ts";

import type { Ops } from "./types.ts";

export type { Ops } from "./types.ts";

/**
 * The operations API over `core.dead_letters`, publishing replays through
 * `replay` (or `queue`). One approval threshold for batches and direct
 * replays: `approvalThreshold`, else `batchPolicy.approvalThreshold` (a
 * `batchPolicy` value wins for batches, e.g. 0 to make every batch wait
 * for approval while small direct replays stay possible).
 */
export function createOps(deps: OpsDeps & { batchPolicy?: Partial<BatchPolicy> }): Ops {
  const approvalThreshold = deps.approvalThreshold ?? deps.batchPolicy?.approvalThreshold;
  const approvalWindowMs = deps.approvalWindowMs ?? deps.batchPolicy?.approvalWindowMs;
  const approval = {
    ...(approvalThreshold !== undefined ? { approvalThreshold } : {}),
    ...(approvalWindowMs !== undefined ? { approvalWindowMs } : {}),
  };
  const deadLetters = new DeadLetterOperations({ ...deps, ...approval });
  return { deadLetters, batches: new ReplayBatches(deadLetters, { ...approval, ...deps.batchPolicy }) };
}
export type { ConsumerStrain, StrainMonitor, StrainRecorder } from "./strain.ts";
export {
  BASELINE_WINDOW_MS,
  DEFAULT_MAX_LATENCY_MULTIPLE,
  DEFAULT_MAX_RATE_LIMITED_MULTIPLE,
  MIN_LATENCY_SAMPLES,
  MIN_RATE_LIMITED,
  strainReason,
  strainRecorder,
  teeMetrics,
} from "./strain.ts";
