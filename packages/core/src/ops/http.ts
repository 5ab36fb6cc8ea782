/**
 * HTTP handlers for Softcrum Ops: one Fetch-API handler `(Request) =>
 * Promise<Response>` (a Next.js route handler, or any Fetch server), JSON in
 * and out, every input validated. Every request must carry an operator
 * credential (see auth.ts); approving a batch needs the approver role. Every
 * mutating call is audited, refused ones included. Routes, under `basePath`:
 *
 *   GET  /dead-letters?queue=&consumer=&tenantId=&kind=&errorClass=&status=&createdAfter=&createdBefore=&limit=&cursor=&order=
 *   GET  /dead-letters/count?<same filter>
 *   GET  /dead-letters/depth
 *   GET  /dead-letters/failed-after-replay?batchId=&limit=&cursor=   a page may hold fewer than limit items and still have a nextCursor
 *   GET  /dead-letters/:id                 with the first 100 history entries and historyNextCursor
 *   GET  /dead-letters/:id/history?limit=&cursor=
 *   POST /dead-letters/discard   { ids, reason }
 *   POST /dead-letters/replay    { ids, reason }
 *   GET  /batches?status=
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
import type { Ops } from "./index.ts";

export interface OpsHandlerOptions {
  readonly ops: Ops;
  readonly authorize: Authorizer;
  /** The path prefix the handler is mounted at. @default "" */
  readonly basePath?: string;
  /** Role needed to approve batches. @default "ops:approver" */
  readonly approverRole?: string;
  /** @default console */
  readonly logger?: Logger;
}

const STATUS: Record<string, number> = {
  INVALID_INPUT: 400,
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
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

export function createOpsHandler(options: OpsHandlerOptions): (request: Request) => Promise<Response> {
  const { ops, authorize } = options;
  const base = (options.basePath ?? "").replace(/\/+$/, "");
  const approverRole = options.approverRole ?? APPROVER_ROLE;
  const logger = options.logger ?? consoleLogger;

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
      method: "GET",
      pattern: /^\/batches$/,
      action: "batch.list",
      mutating: false,
      run: async ({ query }) => {
        const status = parseInput(z.enum(REPLAY_BATCH_STATUSES).optional(), query.get("status") ?? undefined, "status");
        return { items: await ops.batches.list(status ? { status } : {}) };
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
        if (!principal.roles.includes(approverRole)) {
          const message = `approving a batch needs the ${approverRole} role`;
          await ops.deadLetters.audit({
            operator: principal.operator,
            action: "batch.approve",
            scope: { batchId: params[0] },
            result: "refused",
            detail: message,
          });
          throw new OpsError("FORBIDDEN", message);
        }
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
    try {
      const params = (route.pattern.exec(path) ?? []).slice(1).map(decodePathSegment);
      principal = await authorize(request);
      const result = await route.run({
        principal,
        params,
        query: url.searchParams,
        body: () => readJson(request),
      });
      return json(route.method === "POST" && route.action === "batch.create" ? 201 : 200, result);
    } catch (error) {
      const known = isSoftcrumError(error) && STATUS[error.code] !== undefined;
      const status = known ? (STATUS[(error as OpsError).code] as number) : 500;
      if (route.mutating && !principal) {
        // Refused before anything ran: nothing changed, but the attempt is evidence.
        await ops.deadLetters
          .audit({
            operator: refusedSubject(error) ?? "(unauthenticated)",
            action: route.action,
            scope: { path },
            result: "refused",
            detail: describeError(error),
          })
          .catch(() => {});
      }
      if (!known) {
        logger.error(`ops HTTP ${request.method} ${path} failed: ${describeError(error)}`);
        return json(500, { error: { code: "INTERNAL", message: "internal error" } });
      }
      return json(status, { error: { code: (error as OpsError).code, message: (error as Error).message } });
    }
  };
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

async function readJson(request: Request): Promise<unknown> {
  const text = await request.text();
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
