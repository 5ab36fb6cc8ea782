// The public API of @softcrum/core. Adapters live on their own subpaths
// (`@softcrum/core/adapters/memory`) so importing the core loads no vendor SDK.

export type { AlertErrorFields, PostgresErrorFacts } from "./alerts/redact.ts";
export {
  ALERT_ERROR_MAX,
  alertErrorFields,
  errorFingerprint,
  postgresErrorFacts,
  redactErrorMessage,
} from "./alerts/redact.ts";
export type {
  AlertWindowKey,
  AlertWindowStore,
  UnreportedOccurrences,
  WindowDecision,
} from "./alerts/windows.ts";
export { memoryAlertWindows, postgresAlertWindows } from "./alerts/windows.ts";
export type { Clock, ManualClock } from "./clock.ts";
export { createManualClock, systemClock } from "./clock.ts";
export type {
  AnyPgDatabase,
  Consumer,
  ConsumerDefinition,
  HandlerContext,
  HarnessDeps,
  WorkTransaction,
} from "./consumer.ts";
export {
  bindConsumer,
  defineConsumer,
  deliveryBoundMs,
  FENCE_TTL_CLOCK_ALLOWANCE_MS,
  fenceTtlMarginMs,
} from "./consumer.ts";
export type { ConsumerVersion } from "./db/consumer-versions.ts";
export { reportConsumerVersions } from "./db/consumer-versions.ts";
export type { BindPrepared, Preparable } from "./db/prepared-query.ts";
export { preparedQuery } from "./db/prepared-query.ts";
export type {
  AlertWindowRow,
  DeadLetterErrorClass,
  DeadLetterRow,
  DeadLetterStatus,
  OutboxRow,
  ProcessedJobRow,
} from "./db/schema.ts";
export {
  alertWindows,
  DEAD_LETTER_STATUSES,
  deadLetters,
  ERROR_CLASSES,
  LAST_ERROR_MAX,
  outbox,
  processedJobs,
} from "./db/schema.ts";
export type { CreateEnvelopeInput, Envelope, EnvelopeCheck } from "./envelope.ts";
export {
  checkEnvelope,
  createEnvelope,
  ENVELOPE_FIELD_MAX,
  envelopeSchema,
  jobCreatedAt,
  parseEnvelope,
} from "./envelope.ts";
export type { ClassifiedFailure, FailureClass, SoftcrumErrorCode } from "./errors.ts";
export {
  classifyFailure,
  describeError,
  InvalidConfigError,
  InvalidEnvelopeError,
  isSoftcrumError,
  PermanentError,
  QueueClosedError,
  RateLimitedError,
  ReplayNotRoutableError,
  SoftcrumError,
} from "./errors.ts";
export type { FanOutOptions, FanOutReport, FanOutTask, TenantSource, Tier } from "./fanout/index.ts";
export {
  fanOut,
  fanOutCronRoute,
  fanOutJobId,
  runFanOutTick,
  scheduleFanOut,
  TIERS,
  tickAt,
  tiersDue,
} from "./fanout/index.ts";
export type {
  CountTransactionalOptions,
  InProcessLaneBacklogOptions,
  LaneBacklog,
  LaneBacklogEntry,
} from "./lanes/index.ts";
export {
  countTransactional,
  DEFAULT_LANE_BACKLOG_STALE_AFTER_MS,
  inProcessLaneBacklog,
  LANES,
  type Lane,
  laneQueue,
  parseLaneQueue,
} from "./lanes/index.ts";
export type { Admission, RateLimit, RateLimiter, RateLimitSpec, TakeResult, TokenBucket } from "./limits/index.ts";
export { inProcessRateLimiter, perTenant, provider } from "./limits/index.ts";
export type { Outbox, OutboxPublishOptions, OutboxReceipt } from "./outbox/writer.ts";
export { outboxIn } from "./outbox/writer.ts";
export type { AlertPort, DeadLetterAlert } from "./ports/alerts.ts";
export { noopAlerts } from "./ports/alerts.ts";
export type { Logger } from "./ports/logger.ts";
export { consoleLogger } from "./ports/logger.ts";
export type { JobMetricAttributes, MetricsPort } from "./ports/metrics.ts";
export { noopMetrics } from "./ports/metrics.ts";
export type {
  BoundConsumer,
  Delivery,
  DeliveryOutcome,
  DeliveryResult,
  PublishOptions,
  PublishReceipt,
  QueuePort,
  ReplayLanePort,
  TransportHolds,
} from "./queue-port.ts";
export { checkDeliveryBound, isStored, publishUntilStored } from "./queue-port.ts";
export type { DeferralBackoff, RetryPolicy } from "./retry.ts";
export {
  DEFAULT_DEFERRAL_HORIZON_MS,
  DEFAULT_RETRY_POLICY,
  DEFERRAL_FLOOR_MS,
  deferralDelayMs,
  maxRetryWindowMs,
  RATE_LIMIT_BACKOFF,
  resolveRetryPolicy,
  retryDelayMs,
} from "./retry.ts";
