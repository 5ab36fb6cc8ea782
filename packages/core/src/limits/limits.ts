/**
 * A consumer's rate limits (#20, SPEC §7): `limits: [provider("resend",
 * { rate: 10, per: "1s" }), perTenant({ rate: 2, per: "1s" })]`. A provider
 * limit is one bucket for every consumer naming that provider, every tenant
 * and every process; a tenant limit is one bucket per tenant (fair use), of
 * the consumer, or shared by the consumers that give it the same `name`.
 * Checked before the work transaction opens (`RateGate`): a delivery with no
 * token is deferred, never an attempt, never a dead letter.
 */
import { InvalidConfigError } from "../errors.ts";
import type { TokenBucket } from "./port.ts";

export interface RateLimitSpec {
  /** Tokens per window. A positive integer. */
  readonly rate: number;
  /** The window: milliseconds, or `"500ms"`, `"1s"`, `"1m"`, `"1h"`. */
  readonly per: number | string;
}

export interface RateLimit {
  readonly scope: "provider" | "tenant";
  /** A provider's name; a tenant limit's shared name, or "" for the consumer's own. */
  readonly name: string;
  readonly rate: number;
  readonly perMs: number;
}

const NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

function windowMs(per: number | string, owner: string): number {
  let ms: number | undefined;
  if (typeof per === "number") ms = per;
  else if (typeof per === "string") {
    const m = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h)$/.exec(per.trim());
    if (m) ms = Number(m[1]) * (UNITS[m[2] as string] as number);
  }
  if (ms === undefined || !Number.isFinite(ms) || ms < 1 || ms > 86_400_000) {
    throw new InvalidConfigError(
      `${owner}: per must be a window from 1 ms to 24 h, in milliseconds or as "500ms", "1s", "1m", "1h"; got ${JSON.stringify(per)}`,
    );
  }
  return ms;
}

function checked(scope: RateLimit["scope"], name: string, spec: RateLimitSpec, owner: string): RateLimit {
  if (typeof spec !== "object" || spec === null) throw new InvalidConfigError(`${owner}: expected { rate, per }`);
  const { rate } = spec;
  if (!Number.isInteger(rate) || rate < 1 || rate > 1_000_000) {
    throw new InvalidConfigError(`${owner}: rate must be an integer from 1 to 1000000, got ${JSON.stringify(rate)}`);
  }
  const perMs = windowMs(spec.per, owner);
  if (perMs / rate < 1) {
    throw new InvalidConfigError(`${owner}: ${rate} per ${perMs} ms is more than one token a millisecond`);
  }
  return Object.freeze({ scope, name, rate, perMs });
}

/** A provider's limit: one bucket across every tenant, consumer and process that names `name`. */
export function provider(name: string, spec: RateLimitSpec): RateLimit {
  const owner = `provider(${JSON.stringify(name)})`;
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new InvalidConfigError(
      `${owner}: a provider's name is 1-64 of a-z 0-9 . _ -, starting with a letter or digit`,
    );
  }
  return checked("provider", name, spec, owner);
}

/** Fair use per tenant: one bucket per tenant, of this consumer (or of every consumer giving the same `name`). */
export function perTenant(spec: RateLimitSpec, options: { readonly name?: string } = {}): RateLimit {
  const name = options.name ?? "";
  const owner = `perTenant(${name === "" ? "" : JSON.stringify(name)})`;
  if (name !== "" && !NAME.test(name)) {
    throw new InvalidConfigError(`${owner}: a shared name is 1-64 of a-z 0-9 . _ -, starting with a letter or digit`);
  }
  return checked("tenant", name, spec, owner);
}

/** Checks a consumer's `limits` where it is defined: each provider at most once, one tenant limit at most. */
export function checkLimits(limits: unknown, owner: string): readonly RateLimit[] {
  if (limits === undefined) return [];
  if (!Array.isArray(limits))
    throw new InvalidConfigError(`${owner}: limits must be an array of provider()/perTenant()`);
  const providers = new Set<string>();
  let tenant = false;
  for (const limit of limits as RateLimit[]) {
    if (limit?.scope === "provider" && typeof limit.name === "string") {
      if (providers.has(limit.name)) {
        throw new InvalidConfigError(`${owner}: provider "${limit.name}" is limited twice; give it one limit`);
      }
      providers.add(limit.name);
    } else if (limit?.scope === "tenant") {
      if (tenant) throw new InvalidConfigError(`${owner}: one perTenant() limit at most`);
      tenant = true;
    } else {
      throw new InvalidConfigError(`${owner}: limits takes only provider(…) and perTenant(…)`);
    }
  }
  return Object.freeze([...limits]) as readonly RateLimit[];
}

/**
 * The buckets a delivery of `consumer` for `tenantId` takes from: the tenant's
 * first (its fair share), then each provider's (the shared one).
 */
export function bucketsOf(limits: readonly RateLimit[], consumer: string, tenantId: string): TokenBucket[] {
  const ordered = [...limits.filter((l) => l.scope === "tenant"), ...limits.filter((l) => l.scope === "provider")];
  return ordered.map((l) => ({
    key: l.scope === "provider" ? `provider:${l.name}` : `tenant:${l.name === "" ? consumer : l.name}:${tenantId}`,
    rate: l.rate,
    perMs: l.perMs,
  }));
}
