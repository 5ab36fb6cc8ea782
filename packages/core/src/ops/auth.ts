import { createRemoteJWKSet, type JWTPayload, type JWTVerifyGetKey, errors as joseErrors, jwtVerify } from "jose";
import { OpsError } from "../errors.ts";

/** Who is calling: an operator id and their roles. */
export interface Principal {
  readonly operator: string;
  readonly roles: readonly string[];
}

/** Verifies a request's credential. Throws `OpsError` UNAUTHENTICATED (none or invalid) or FORBIDDEN (not an operator). */
export type Authorizer = (request: Request) => Promise<Principal>;

export const OPERATOR_ROLE = "ops:operator";
export const APPROVER_ROLE = "ops:approver";

export interface JwtAuthorizerOptions {
  /** HS256 shared secret (at least 32 bytes). Give this or `jwksUrl`. */
  readonly secret?: string | Uint8Array;
  /** Where the issuer publishes its public keys (RS256/ES256/EdDSA). */
  readonly jwksUrl?: string | URL;
  /** Required `iss`. @default not checked */
  readonly issuer?: string;
  /** Required `aud`. @default not checked */
  readonly audience?: string;
  /** The role every caller needs. @default "ops:operator" */
  readonly operatorRole?: string;
}

/**
 * The default authorizer: a `Bearer` JWT whose signature, expiry (and issuer,
 * audience when configured) verify, whose `sub` names the operator and whose
 * `roles` (array) or `role` (string) claim includes the operator role. A
 * tenant credential (a `tenant_id` claim, in any spelling) is refused
 * whatever its roles: tenants never touch queues. The algorithm is pinned
 * (HS256 with a secret), and the operator is `sub` in lower case.
 */
export function jwtAuthorizer(options: JwtAuthorizerOptions): Authorizer {
  const operatorRole = options.operatorRole ?? OPERATOR_ROLE;
  let key: Uint8Array | JWTVerifyGetKey;
  if (options.secret !== undefined) {
    key = typeof options.secret === "string" ? new TextEncoder().encode(options.secret) : options.secret;
    if (key.length < 32)
      throw new OpsError("INVALID_INPUT", "jwtAuthorizer: the HS256 secret must be at least 32 bytes");
  } else if (options.jwksUrl !== undefined) {
    key = createRemoteJWKSet(new URL(options.jwksUrl));
  } else {
    throw new OpsError("INVALID_INPUT", "jwtAuthorizer needs a secret or a jwksUrl");
  }
  const verifyOptions = {
    // A token without an expiry would be valid forever.
    requiredClaims: ["exp", "sub"],
    // Pinned: a shared secret signs HS256 only; a key set, asymmetric algorithms only.
    algorithms: options.secret !== undefined ? ["HS256"] : ASYMMETRIC_ALGORITHMS,
    ...(options.issuer ? { issuer: options.issuer } : {}),
    ...(options.audience ? { audience: options.audience } : {}),
  };

  return async (request) => {
    const header = request.headers.get("authorization") ?? "";
    const match = /^Bearer\s+(\S+)$/i.exec(header);
    if (!match?.[1])
      throw new OpsError("UNAUTHENTICATED", "an operator token is required (Authorization: Bearer <JWT>)");
    let payload: JWTPayload;
    try {
      ({ payload } =
        typeof key === "function"
          ? await jwtVerify(match[1], key, verifyOptions)
          : await jwtVerify(match[1], key, verifyOptions));
    } catch (error) {
      const why = error instanceof joseErrors.JWTExpired ? "the token has expired" : "the token is not valid";
      throw new OpsError("UNAUTHENTICATED", why);
    }
    // One person, one name: subjects that differ only in case are the same
    // operator to the two-person rule and the quotas.
    const subject = typeof payload.sub === "string" ? payload.sub.trim().toLowerCase() : "";
    if (Object.keys(payload).some((claim) => TENANT_CLAIM.test(claim))) {
      throw refused(subject, "a tenant credential cannot operate queues; use an operator token");
    }
    const roles = rolesOf(payload);
    if (subject === "") throw new OpsError("UNAUTHENTICATED", "the token names no operator (sub)");
    if (!roles.includes(operatorRole)) throw refused(subject, `the ${operatorRole} role is required`);
    return { operator: subject, roles };
  };
}

/** A tenant credential's claim in any spelling: tenant_id, tenantId, tenant-id, tenant. */
const TENANT_CLAIM = /^tenant([_-]?id)?$/i;

const ASYMMETRIC_ALGORITHMS = [
  "RS256",
  "RS384",
  "RS512",
  "PS256",
  "PS384",
  "PS512",
  "ES256",
  "ES384",
  "ES512",
  "EdDSA",
];

/** A FORBIDDEN error that remembers who was refused, for the audit. */
function refused(subject: string, message: string): OpsError {
  return Object.assign(new OpsError("FORBIDDEN", message), { subject: subject || undefined });
}

function rolesOf(payload: JWTPayload): string[] {
  const roles = payload["roles"];
  if (Array.isArray(roles)) return roles.filter((r): r is string => typeof r === "string");
  const role = payload["role"];
  return typeof role === "string" ? [role] : [];
}
