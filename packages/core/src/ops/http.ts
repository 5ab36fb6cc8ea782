/**
 * HTTP handlers for Softcrum Ops: one Fetch-API handler `(Request) =>
 * Promise<Response>` (a Next.js route handler, or any Fetch server), JSON in
 * and out, every input validated. Every request must carry an operator
 * credential (see auth.ts); approving a batch needs the approver role. Every
 * mutating call is audited, refused ones included, exactly once (see
 * refusals.ts): calls that prove no identity as one row per source per minute.
 * Ids in the path must be UUIDs and no parameter may hold a NUL byte: 400
 * before any query. A body is read up to `maxBodyBytes` (default 1 MiB,
 * MAX_BODY_BYTES): past it, or when Content-Length says so, 413 without
 * reading the rest. Routes, under `basePath`:
 *
 *   GET  /dead-letters?queue=&consumer=&tenantId=&kind=&errorClass=&status=&createdAfter=&createdBefore=&limit=&cursor=&order=
 *   GET  /dead-letters/count?<same filter>
 *   GET  /dead-letters/depth
 *   GET  /dead-letters/failed-after-replay?batchId=&limit=&cursor=   a page may hold fewer than limit items and still have a nextCursor
 *   GET  /dead-letters/:id                 with the first 100 history entries and historyNextCursor
 *   GET  /dead-letters/:id/history?limit=&cursor=
 *   POST /dead-letters/discard   { ids, reason }
 *   POST /dead-letters/replay    { ids, reason }
 *   POST /dead-letters/replay-again { ids, reason }  (replayed letters whose replay never ran)
 *   GET  /batches?status=&limit=&cursor=   a page (limit ≤ 500, default 50) and its nextCursor
 *   POST /batches                { filter, reason, ratePerSecond, batchSize?, sampleSize?, maxFailureRate?, limit?, expiresAt? | expiresInMinutes? }
 *   GET  /batches/:id
 *   POST /batches/:id/approve
 *   POST /batches/:id/pause|resume|stop   { reason }
 *   POST /batches/:id/run        { maxDurationMs? }  runs for at most that long (default 10 s), call again to continue
 */
import { z } from "zod";
import { REPLAY_BATCH_STATUSES } from "../db/schema.ts";
import { describeError, isSoftcrumError, OpsError } from "../errors.ts";
import { consoleLogger, type Logger } from "../ports/logger.ts";
import { APPROVER_ROLE, type Authorizer, type Principal } from "./auth.ts";
import { idListSchema, parseInput, reasonSchema } from "./filters.ts";
import { UnauthenticatedAudit, wasAudited } from "./refusals.ts";
import type { Ops } from "./types.ts";

/** The default largest request body the handler reads: 1 MiB. Larger ones are answered 413. */
export const MAX_BODY_BYTES = 1024 * 1024;

export interface OpsHandlerOptions {
  readonly ops: Ops;
  readonly authorize: Authorizer;
  /** The path prefix the handler is mounted at. @default "" */
  readonly basePath?: string;
  /** Role needed to approve batches. @default "ops:approver" */
  readonly approverRole?: string;
  /** @default console */
  readonly logger?: Logger;
  /** Largest request body read, in bytes; a larger one is answered 413 unread. @default MAX_BODY_BYTES (1 MiB) */
  readonly maxBodyBytes?: number;
  /**
   * Where a request comes from, for counting unauthenticated calls per source
   * and minute. Only as trustworthy as the proxy in front (on Vercel the
   * platform sets x-forwarded-for). @default the first x-forwarded-for address, else "unknown"
   */
  readonly sourceOf?: (request: Request) => string;
}

const STATUS: Record<string, number> = {
  INVALID_INPUT: 400,
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  PAYLOAD_TOO_LARGE: 413,
};

const idsBody = z.strictObject({ ids: idListSchema, reason: reasonSchema });
const reasonBody = z.strictObject({ reason: reasonSchema });
const runBody = z.strictObject({ maxDurationMs: z.number().int().min(100).max(60_000).default(10_000) });
const pageKeys = ["limit", "cursor", "order"];

type Route = {
  method: "GET" | "POST";
  pattern: RegExp;
  action: string;
  mutating: boolean;
  run: (ctx: {
    principal: Principal;
    params: string[];
    query: URLSearchParams;
    body: () => Promise<unknown>;
  }) => Promise<unknown>;
};

const batchListQuery = z.strictObject({
  status: z.enum(REPLAY_BATCH_STATUSES).optional(),
  limit: z.coerce.number().int().min(1).max(500).optional(),
  cursor: z.uuid({ error: "is not a cursor from a previous page" }).optional(),
});

export function createOpsHandler(options: OpsHandlerOptions): (request: Request) => Promise<Response> {
  const { ops, authorize } = options;
  const base = (options.basePath ?? "").replace(/\/+$/, "");
  const approverRole = options.approverRole ?? APPROVER_ROLE;
  const logger = options.logger ?? consoleLogger;
  const maxBodyBytes = options.maxBodyBytes ?? MAX_BODY_BYTES;
  const sourceOf = options.sourceOf ?? defaultSource;
  const unauthenticated = new UnauthenticatedAudit(ops.deadLetters.db);

  const routes: Route[] = [
    {
      method: "GET",
      pattern: /^\/dead-letters$/,
      action: "dead_letter.list",
      mutating: false,
      run: ({ query }) => {
        const { filter, page } = splitQuery(query);
        return ops.deadLetters.list(filter, page);
      },
    },
    {
      method: "GET",
      pattern: /^\/dead-letters\/count$/,
      action: "dead_letter.count",
      mutating: false,
      run: async ({ query }) => ({ count: await ops.deadLetters.count(splitQuery(query, false).filter) }),
    },
    {
      method: "GET",
      pattern: /^\/dead-letters\/depth$/,
      action: "dead_letter.depth",
      mutating: false,
      run: async () => ({ items: await ops.deadLetters.depth() }),
    },
    {
      method: "GET",
      pattern: /^\/dead-letters\/failed-after-replay$/,
      action: "dead_letter.failed_after_replay",
      mutating: false,
      run: async ({ query }) => {
        const { batchId, ...page } = onlyKeys(query, ["batchId", "limit", "cursor"]);
        return ops.deadLetters.failedAfterReplay(batchId ? { batchId } : {}, page);
      },
    },
    {
      method: "GET",
      pattern: /^\/dead-letters\/([^/]+)\/history$/,
      action: "dead_letter.history",
      mutating: false,
      run: ({ params, query }) => ops.deadLetters.history(params[0] as string, onlyKeys(query, ["limit", "cursor"])),
    },
    {
      method: "GET",
      pattern: /^\/dead-letters\/([^/]+)$/,
      action: "dead_letter.get",
      mutating: false,
      run: ({ params }) => ops.deadLetters.get(params[0] as string),
    },
    {
      method: "POST",
      pattern: /^\/dead-letters\/discard$/,
      action: "dead_letter.discard",
      mutating: true,
      run: async ({ principal, body }) => {
        const { ids, reason } = parseInput(idsBody, await body(), "body");
        return ops.deadLetters.discard(ids, { operator: principal.operator, reason });
      },
    },
    {
      method: "POST",
      pattern: /^\/dead-letters\/replay$/,
      action: "dead_letter.replay",
      mutating: true,
      run: async ({ principal, body }) => {
        const { ids, reason } = parseInput(idsBody, await body(), "body");
        return ops.deadLetters.replay(ids, { operator: principal.operator, reason });
      },
    },
    {
      method: "POST",
      pattern: /^\/dead-letters\/replay-again$/,
      action: "dead_letter.replay_again",
      mutating: true,
      run: async ({ principal, body }) => {
        const { ids, reason } = parseInput(idsBody, await body(), "body");
        return ops.deadLetters.replayAgain(ids, { operator: principal.operator, reason });
      },
    },
    {
      method: "GET",
      pattern: /^\/batches$/,
      action: "batch.list",
      mutating: false,
      run: async ({ query }) => {
        // Every parameter known, or 400: a misspelt filter never widens the list.
        const { status, limit, cursor } = parseInput(batchListQuery, Object.fromEntries(query), "query");
        const pageSize = limit ?? 50;
        const items = await ops.batches.list({
          ...(status ? { status } : {}),
          ...(cursor ? { cursor } : {}),
          limit: pageSize,
        });
        return { items, nextCursor: items.length === pageSize ? (items.at(-1)?.id ?? null) : null };
      },
    },
    {
      method: "POST",
      pattern: /^\/batches$/,
      action: "batch.create",
      mutating: true,
      run: async ({ principal, body }) => {
        const input = await body();
        if (typeof input !== "object" || input === null || "operator" in input) {
          throw new OpsError(
            "INVALID_INPUT",
            "invalid body: a JSON object without `operator` (the token names the operator)",
          );
        }
        return ops.batches.create({ ...(input as object), operator: principal.operator } as never);
      },
    },
    {
      method: "GET",
      pattern: /^\/batches\/([^/]+)$/,
      action: "batch.get",
      mutating: false,
      run: ({ params }) => ops.batches.get(params[0] as string),
    },
    {
      method: "POST",
      pattern: /^\/batches\/([^/]+)\/approve$/,
      action: "batch.approve",
      mutating: true,
      run: async ({ principal, params }) => {
        // Refused here, audited by the dispatcher like every other refusal.
        if (!principal.roles.includes(approverRole))
          throw new OpsError("FORBIDDEN", `approving a batch needs the ${approverRole} role`);
        return ops.batches.approve(params[0] as string, { operator: principal.operator });
      },
    },
    ...(["pause", "resume", "stop"] as const).map(
      (verb): Route => ({
        method: "POST",
        pattern: new RegExp(`^/batches/([^/]+)/${verb}$`),
        action: `batch.${verb}`,
        mutating: true,
        run: async ({ principal, params, body }) => {
          const { reason } = parseInput(reasonBody, await body(), "body");
          return ops.batches[verb](params[0] as string, { operator: principal.operator, reason });
        },
      }),
    ),
    {
      method: "POST",
      pattern: /^\/batches\/([^/]+)\/run$/,
      action: "batch.run",
      mutating: true,
      run: async ({ principal, params, body }) => {
        const { maxDurationMs } = parseInput(runBody, (await body()) ?? {}, "body");
        return ops.batches.run(params[0] as string, { operator: principal.operator, maxDurationMs });
      },
    },
  ];

  return async (request) => {
    const url = new URL(request.url);
    if (!url.pathname.startsWith(base)) return json(404, { error: { code: "NOT_FOUND", message: "no such route" } });
    const path = url.pathname.slice(base.length) || "/";
    const matching = routes.filter((r) => r.pattern.test(path));
    if (matching.length === 0) return json(404, { error: { code: "NOT_FOUND", message: `no route ${path}` } });
    const route = matching.find((r) => r.method === request.method);
    if (!route) {
      return json(
        405,
        { error: { code: "METHOD_NOT_ALLOWED", message: `${request.method} ${path}` } },
        {
          allow: [...new Set(matching.map((r) => r.method))].join(", "),
        },
      );
    }
    let principal: Principal | undefined;
    let params: string[] = [];
    try {
      principal = await authorize(request);
      // After authentication: a caller without a credential learns nothing about ids or routes' input.
      params = (route.pattern.exec(path) ?? []).slice(1).map(decodePathSegment);
      for (const param of params) parseInput(pathIdSchema, param, "id in the path");
      for (const [key, value] of url.searchParams) {
        if (key.includes("\u0000") || value.includes("\u0000")) {
          throw new OpsError(
            "INVALID_INPUT",
            `invalid query parameter "${key.replaceAll("\u0000", "\\0")}": must not contain a NUL byte`,
          );
        }
      }
      const result = await route.run({
        principal,
        params,
        query: url.searchParams,
        body: () => readJson(request, maxBodyBytes),
      });
      return json(route.method === "POST" && route.action === "batch.create" ? 201 : 200, result);
    } catch (error) {
      const known = isSoftcrumError(error) && STATUS[error.code] !== undefined;
      const status = known ? (STATUS[(error as OpsError).code] as number) : 500;
      // Every refused mutating call leaves one audit row; the library already wrote one for what it refused.
      if (route.mutating && !wasAudited(error)) {
        await auditRefusal(error, status, principal, params).catch((auditError) =>
          logger.error(`ops HTTP: could not audit a refused ${route.action}: ${describeError(auditError)}`),
        );
      }
      if (!known) {
        logger.error(`ops HTTP ${request.method} ${path} failed: ${describeError(error)}`);
        return json(500, { error: { code: "INTERNAL", message: "internal error" } });
      }
      return json(status, { error: { code: (error as OpsError).code, message: (error as Error).message } });
    }

    async function auditRefusal(error: unknown, status: number, who: Principal | undefined, ids: string[]) {
      const detail = describeError(error);
      const action = (route as Route).action;
      if (!who) {
        const subject = refusedSubject(error);
        if (subject === undefined) {
          // No identity proven: counted per source and minute, never a row per request.
          return unauthenticated.record({
            source: sourceOf(request),
            action,
            path,
            detail,
            now: ops.deadLetters.clock.now(),
          });
        }
        // A credential that verified but may not operate: its subject is evidence.
        return ops.deadLetters.audit({ operator: subject, action, scope: { path }, result: "refused", detail });
      }
      const scope = { path, ...(ids[0] && path.startsWith("/batches/") ? { batchId: ids[0] } : {}) };
      const result = status === 403 ? "refused" : status >= 500 ? "error" : "rejected";
      return ops.deadLetters.audit({ operator: who.operator, action, scope, result, detail });
    }
  };
}

const pathIdSchema = z.uuid({ error: "must be a UUID" });

/** The first address of x-forwarded-for (set by the platform's proxy), else "unknown". */
function defaultSource(request: Request): string {
  const forwarded = request.headers.get("x-forwarded-for")?.split(",")[0]?.trim();
  return forwarded || request.headers.get("x-real-ip")?.trim() || "unknown";
}

/** Who a FORBIDDEN credential belonged to, when the authorizer could tell. */
function refusedSubject(error: unknown): string | undefined {
  const subject = (error as { subject?: unknown })?.subject;
  return typeof subject === "string" && subject !== "" ? `${subject} (refused)` : undefined;
}

function decodePathSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new OpsError("INVALID_INPUT", `bad percent-encoding in the path: ${segment}`);
  }
}

/** The query's parameters, refusing any not in `keys` (a typo must not be ignored). */
function onlyKeys(query: URLSearchParams, keys: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of query) {
    if (!keys.includes(key)) {
      throw new OpsError("INVALID_INPUT", `unknown query parameter "${key}" (accepted: ${keys.join(", ")})`);
    }
    out[key] = value;
  }
  return out;
}

/** Query parameters as a filter and a page; unknown names are refused (a typo must not widen a selection). */
function splitQuery(query: URLSearchParams, withPage = true) {
  const filter: Record<string, string> = {};
  const page: Record<string, string> = {};
  for (const [key, value] of query) {
    if (withPage && pageKeys.includes(key)) page[key] = value;
    else filter[key] = value;
  }
  return { filter, page };
}

/**
 * The body as JSON, read up to `maxBytes`: a declared Content-Length past it is
 * refused before reading anything, and a streamed body as soon as it passes it
 * (the stream is cancelled: the rest is never read).
 */
async function readJson(request: Request, maxBytes: number): Promise<unknown> {
  const tooLarge = () =>
    new OpsError("PAYLOAD_TOO_LARGE", `the body is larger than ${maxBytes} bytes, the limit of this API`);
  const declared = Number(request.headers.get("content-length") ?? Number.NaN);
  if (declared > maxBytes) throw tooLarge();
  const chunks: Uint8Array[] = [];
  if (request.body) {
    const reader = request.body.getReader();
    let size = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > maxBytes) {
        await reader.cancel().catch(() => {});
        throw tooLarge();
      }
      chunks.push(value);
    }
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(Buffer.concat(chunks));
  } catch {
    throw new OpsError("INVALID_INPUT", "the body is not valid UTF-8");
  }
  if (text.trim() === "") return undefined;
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new OpsError("INVALID_INPUT", `the body is not valid JSON: ${(error as Error).message}`);
  }
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}
