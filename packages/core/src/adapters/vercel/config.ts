/**
 * The adapter's configuration: the service's documented limits, the options
 * a module passes (`VercelQueueOptions`), and `resolveVercelQueueConfig`,
 * which reads and checks them once into a `VercelQueueConfig`, plus what the
 * other files derive from it (the longest delay, the largest job, the hold).
 * Also the adapter's own limits (private to the adapter: not re-exported by
 * index.ts).
 */
import type { Clock } from "../../clock.ts";
import { InvalidConfigError } from "../../errors.ts";
import type { Logger } from "../../ports/logger.ts";
import type { MetricsPort } from "../../ports/metrics.ts";
import type { VercelIncident } from "./types.ts";
import { MIN_WRAPPER_SECRET_LENGTH, WRAPPER_RESERVE_BYTES } from "./wrapper.ts";

/** Longest retention Vercel Queues documents (7 days; an earlier doc version said 24 h: configurable). */
export const VERCEL_MAX_RETENTION_SECONDS = 604_800;
/** Longest lease (visibility timeout) the SDK documents; a retry directive cannot wait longer. */
export const VERCEL_MAX_VISIBILITY_SECONDS = 3_600;
/** Largest message the service documents (100 MB). */
export const VERCEL_MAX_MESSAGE_BYTES = 100_000_000;
/** Deliveries a push trigger makes when `vercelTrigger` is not told otherwise (what `vercel dev` does). */
export const DEFAULT_MAX_DELIVERIES = 32;
const MIN_RETENTION_SECONDS = 60;
const MIN_VISIBILITY_SECONDS = 30;
export const MAX_IDEMPOTENCY_KEY = 256;
export const DEFAULT_MAX_ATTEMPTS = 5;
/**
 * A redelivery must be due this long before the message expires, or the
 * adapter does not count on it: room for clock skew, a slow callback and the
 * service's own delay after a failed one.
 */
export const EXPIRY_MARGIN_MS = 300_000;
const REGION_PATTERN = /^[a-z]{2,5}[0-9]{1,2}$/;
/** Longest a push request or `receiveAvailable` waits for its dead-letter alerts before it answers anyway. */
export const ALERT_FLUSH_TIMEOUT_MS = 10_000;
/** Tries of an acknowledgement or a visibility change (network errors, 429 with a short Retry-After), as the SDK. */
export const DIRECTIVE_TRIES = 3;
/** Longest Retry-After a directive waits for within one delivery. */
export const DIRECTIVE_MAX_RETRY_AFTER_S = 5;
/**
 * Taken off every lease of a delivery once the service refused one as
 * reaching past the message's expiry (400): the adapter's clock behind the
 * service's, or the request's latency.
 */
export const LEASE_SKEW_MARGIN_MS = 30_000;

export interface VercelQueueOptions {
  /**
   * Vercel region of the queues. Poll workers must name it here (a fixed
   * region): a message can be consumed only in the region it was sent to, and
   * a function's VERCEL_REGION changes on failover. @default env VERCEL_REGION (set by Vercel in functions); required
   */
  readonly region?: string;
  /** API token. @default OIDC: env VERCEL_OIDC_TOKEN, or the per-request token on Vercel (VERCEL=1) */
  readonly token?: string;
  /** Deployment the sends are pinned to; `null` sends unpinned. @default env VERCEL_DEPLOYMENT_ID; required unless null */
  readonly deploymentId?: string | null;
  /** Where the API lives. @default the SDK's `https://{region}.vercel-queue.com` */
  readonly resolveBaseUrl?: (region: string) => URL;
  /**
   * The retention asked for every message: how long the service keeps it,
   * delay included. Set it to what the service accepts (7 days in the current
   * docs, 24 h in an earlier version). The fence TTL must cover it
   * (`transportHoldMs`). @default 604_800 (60..604800)
   */
  readonly retentionSeconds?: number;
  /**
   * The least time a message has between becoming due and expiring: the
   * longest single delay is `retentionSeconds` − this; a longer delay or
   * `schedule()` travels in hops. @default half the retention, at most 86_400
   */
  readonly deliveryWindowSeconds?: number;
  /** Largest message the service accepts; publish refuses an envelope that could not be wrapped within it. @default 100_000_000 */
  readonly maxMessageBytes?: number;
  /**
   * Longest the adapter waits for the service's answer to one of its own
   * republishes (a deferral, a hop, a rescue) before it takes the copy as
   * not stored and keeps the original (a copy stored after all is a
   * successor like any other). The SDK's send has no timeout of its own.
   * Also how long a delivery's directive (its acknowledgement or visibility
   * change) waits for a lease renewal still in flight.
   * @default 10_000 (1_000..60_000)
   */
  readonly republishTimeoutMs?: number;
  /** Lease taken per delivery; renewed while the handler runs. @default 300 (30..3600) */
  readonly visibilityTimeoutSeconds?: number;
  /** How often a lease is renewed while the handler runs. @default as the SDK: min(60, max(10, visibility / 5)) s */
  readonly leaseRenewalMs?: number;
  /** For `schedule()`'s runAt − now and every lease and expiry decision. @default the system clock */
  readonly clock?: Clock;
  /** Where the configuration is read from. @default process.env */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** @default console */
  readonly logger?: Logger;
  /**
   * Called for every transport incident (a failed acknowledgement, a lease
   * renewal lost, an unconfirmed push callback, auth failures …): count them
   * as a metric, page on `alert: true`. Never throws into the adapter. @default none (they are logged)
   */
  readonly onIncident?: (incident: VercelIncident) => void;
  /** Counts every incident (`MetricsPort.transportIncident`, e.g. `createOtelMetrics()`). @default none */
  readonly metrics?: Pick<MetricsPort, "transportIncident">;
  /**
   * The secret that signs the wrappers the adapter sends (deferrals, hops,
   * rescues, delayed and addressed publishes): a wrapper says whom a job is
   * for and the attempts it spent, so one not signed with it is an ordinary
   * message (#19). At least 32 characters, the same in every deployment that
   * publishes to or consumes these queues; keep it with the other secrets.
   * @default env SOFTCRUM_QUEUE_SECRET; required
   */
  readonly wrapperSecret?: string;
  /**
   * Also read the unsigned wrappers of releases before #19: set it for the
   * deploy that introduces signing, until the old deferrals have drained (at
   * most `retentionSeconds`), then remove it — while it is set, a foreign
   * producer can forge a wrapper. @default false
   */
  readonly acceptUnsignedWrappers?: boolean;
  /**
   * The configuration `resolveVercelQueueConfig` already read and checked
   * from these same options (a process that needs it before it creates the
   * adapter, e.g. the retention for its fence check): taken as it is instead
   * of being read again, so one start-up reads its settings once. Only an
   * object `resolveVercelQueueConfig` returned is accepted.
   * @default read from these options
   */
  readonly config?: VercelQueueConfig;
}

export interface VercelQueueConfig {
  readonly region: string;
  /** True when the region came from options.region (a fixed region), not from VERCEL_REGION. */
  readonly regionFixed: boolean;
  readonly token: string | undefined;
  readonly deploymentId: string | null;
  readonly retentionSeconds: number;
  readonly deliveryWindowSeconds: number;
  readonly maxMessageBytes: number;
  readonly visibilityTimeoutSeconds: number;
  readonly leaseRenewalMs: number;
  readonly republishTimeoutMs: number;
  readonly wrapperSecret: string;
  readonly acceptUnsignedWrappers: boolean;
  /** How long the service may hold a message (its retention), for the fence cleanup's `transportHoldMs`. */
  readonly transportHoldMs: number;
}

/** The configurations `resolveVercelQueueConfig` returned: checked, so `options.config` may be taken as it is. */
const resolvedConfigs = new WeakSet<VercelQueueConfig>();

/**
 * Reads and checks the configuration the SDK needs, so that a missing region,
 * credential or deployment id fails when the module binds its adapter, not on
 * the first message. Throws one `InvalidConfigError` listing every problem.
 */
export function resolveVercelQueueConfig(options: VercelQueueOptions = {}): VercelQueueConfig {
  const env = options.env ?? process.env;
  const problems: string[] = [];
  const region = options.region ?? env["VERCEL_REGION"];
  if (!region) {
    problems.push("region: pass options.region or set VERCEL_REGION (e.g. iad1; Vercel sets it in functions)");
  } else if (!REGION_PATTERN.test(region)) {
    problems.push(`region: ${JSON.stringify(region)} is not a Vercel region code (e.g. iad1, fra1)`);
  }
  const token = options.token ?? undefined;
  if (token === "") problems.push("token: options.token is empty");
  const oidc = env["VERCEL_OIDC_TOKEN"];
  const onVercel = env["VERCEL"] === "1";
  if (token === undefined && !oidc && !onVercel) {
    problems.push(
      "credentials: pass options.token, set VERCEL_OIDC_TOKEN (`vercel env pull`), or run on Vercel (VERCEL=1), where each request carries an OIDC token",
    );
  }
  let deploymentId: string | null;
  if (options.deploymentId === null) deploymentId = null;
  else {
    deploymentId = options.deploymentId ?? env["VERCEL_DEPLOYMENT_ID"] ?? "";
    if (deploymentId === "") {
      problems.push(
        "deployment: set VERCEL_DEPLOYMENT_ID, pass options.deploymentId, or pass deploymentId: null to send unpinned",
      );
    }
  }
  const retentionSeconds = options.retentionSeconds ?? VERCEL_MAX_RETENTION_SECONDS;
  const retentionOk =
    Number.isInteger(retentionSeconds) &&
    retentionSeconds >= MIN_RETENTION_SECONDS &&
    retentionSeconds <= VERCEL_MAX_RETENTION_SECONDS;
  if (!retentionOk) {
    problems.push(
      `retentionSeconds: must be an integer in ${MIN_RETENTION_SECONDS}..${VERCEL_MAX_RETENTION_SECONDS} (what the service accepts), got ${retentionSeconds}`,
    );
  }
  const deliveryWindowSeconds =
    options.deliveryWindowSeconds ?? Math.min(86_400, Math.floor((retentionOk ? retentionSeconds : 86_400) / 2));
  if (
    !Number.isInteger(deliveryWindowSeconds) ||
    deliveryWindowSeconds < 30 ||
    (retentionOk && deliveryWindowSeconds > retentionSeconds - 30)
  ) {
    problems.push(
      `deliveryWindowSeconds: must be an integer from 30 to retentionSeconds − 30 (a message needs time to be delivered after its delay), got ${deliveryWindowSeconds}`,
    );
  }
  const maxMessageBytes = options.maxMessageBytes ?? VERCEL_MAX_MESSAGE_BYTES;
  if (
    !Number.isInteger(maxMessageBytes) ||
    maxMessageBytes < 4 * WRAPPER_RESERVE_BYTES ||
    maxMessageBytes > VERCEL_MAX_MESSAGE_BYTES
  ) {
    problems.push(
      `maxMessageBytes: must be an integer in ${4 * WRAPPER_RESERVE_BYTES}..${VERCEL_MAX_MESSAGE_BYTES}, got ${maxMessageBytes}`,
    );
  }
  const visibilityTimeoutSeconds = options.visibilityTimeoutSeconds ?? 300;
  const visibilityOk =
    Number.isInteger(visibilityTimeoutSeconds) &&
    visibilityTimeoutSeconds >= MIN_VISIBILITY_SECONDS &&
    visibilityTimeoutSeconds <= VERCEL_MAX_VISIBILITY_SECONDS;
  if (!visibilityOk) {
    problems.push(
      `visibilityTimeoutSeconds: must be an integer in ${MIN_VISIBILITY_SECONDS}..${VERCEL_MAX_VISIBILITY_SECONDS}, got ${visibilityTimeoutSeconds}`,
    );
  }
  const defaultRenewalMs = Math.min(60, Math.max(10, (visibilityOk ? visibilityTimeoutSeconds : 300) / 5)) * 1000;
  const leaseRenewalMs = options.leaseRenewalMs ?? defaultRenewalMs;
  if (!Number.isFinite(leaseRenewalMs) || leaseRenewalMs <= 0 || leaseRenewalMs > defaultRenewalMs) {
    problems.push(
      `leaseRenewalMs: must be above 0 and at most ${defaultRenewalMs} (a renewal must come well before the lease ends), got ${leaseRenewalMs}`,
    );
  }
  const republishTimeoutMs = options.republishTimeoutMs ?? 10_000;
  if (!Number.isInteger(republishTimeoutMs) || republishTimeoutMs < 1_000 || republishTimeoutMs > 60_000) {
    problems.push(
      `republishTimeoutMs: must be an integer from 1000 to 60000 (a republish waits inside a delivery), got ${republishTimeoutMs}`,
    );
  }
  const wrapperSecret = options.wrapperSecret ?? env["SOFTCRUM_QUEUE_SECRET"] ?? "";
  if (typeof wrapperSecret !== "string" || wrapperSecret.length < MIN_WRAPPER_SECRET_LENGTH) {
    problems.push(
      `wrapperSecret: pass options.wrapperSecret or set SOFTCRUM_QUEUE_SECRET, at least ${MIN_WRAPPER_SECRET_LENGTH} characters (e.g. \`openssl rand -base64 32\`), the same in every deployment that uses these queues: it signs the wrappers of deferred and addressed jobs`,
    );
  }
  if (problems.length > 0) {
    throw new InvalidConfigError(`Vercel Queues adapter is not configured:\n- ${problems.join("\n- ")}`);
  }
  const config: VercelQueueConfig = Object.freeze({
    region: region as string,
    regionFixed: options.region !== undefined,
    token,
    deploymentId,
    retentionSeconds,
    deliveryWindowSeconds,
    maxMessageBytes,
    visibilityTimeoutSeconds,
    leaseRenewalMs,
    republishTimeoutMs,
    wrapperSecret,
    acceptUnsignedWrappers: options.acceptUnsignedWrappers === true,
    transportHoldMs: retentionSeconds * 1000,
  });
  resolvedConfigs.add(config);
  return config;
}

/** The configuration of these options: the one resolved already (`options.config`), or read and checked now. */
export function configOf(options: VercelQueueOptions): VercelQueueConfig {
  if (options.config === undefined) return resolveVercelQueueConfig(options);
  if (!resolvedConfigs.has(options.config)) {
    throw new InvalidConfigError(
      "options.config: pass what resolveVercelQueueConfig returned (its checks are what lets the adapter take it as it is), or leave it out",
    );
  }
  return options.config;
}

/** Longest delay one message can carry: its retention less the window it needs to be delivered. */
export function maxDelaySeconds(config: VercelQueueConfig): number {
  return config.retentionSeconds - config.deliveryWindowSeconds;
}

/** Largest job (envelope or foreign body) this transport can still wrap for a deferral, a hop or a replay. */
export function maxBodyBytes(config: VercelQueueConfig): number {
  return config.maxMessageBytes - WRAPPER_RESERVE_BYTES;
}
