/**
 * Push delivery: `pushHandler(bound)` is a Next.js App Router route handler
 * for a vercel.json queue trigger (`vercelTrigger` writes the trigger
 * block). It reads the callback, runs the delivery through the lease
 * lifecycle (lease.ts) — an inline body only once the service confirms the
 * lease, a routing-only callback received by id — answers the service, and
 * first flushes the dead-letter alerts the request wrote.
 */
import { parseCallback } from "@vercel/queue";
import { describeError } from "../../errors.ts";
import type { BoundConsumer } from "../../queue-port.ts";
import { positiveInteger } from "../../validate.ts";
import { bindLane, flushAlerts, type Lane, type Outcome } from "./lane.ts";
import type { ModeContext } from "./lease.ts";
import { errorName, type QueueMessage, rawTransport } from "./service.ts";
import type { VercelRouteOptions } from "./types.ts";

export function pushHandler(
  ctx: ModeContext,
  consumer: BoundConsumer,
  route: VercelRouteOptions = {},
): (request: Request) => Promise<Response> {
  const retryAfterSeconds = positiveInteger(route.retryAfterSeconds ?? 60, "retryAfterSeconds");
  const lane = bindLane(ctx.config, ctx.api, consumer, "push", route.maxDeliveries, retryAfterSeconds);
  return async (request: Request) => {
    try {
      return await handlePush(ctx, lane, request);
    } finally {
      // The function may be frozen or ended once it answers: the alerts of
      // the letters this request wrote go out (or are recorded) first.
      await flushAlerts(consumer, ctx.logger);
    }
  };
}

async function handlePush(ctx: ModeContext, bound: Lane, request: Request): Promise<Response> {
  let callback: Awaited<ReturnType<typeof parseCallback>>;
  try {
    callback = await parseCallback(request);
  } catch (error) {
    return Response.json({ error: describeError(error) }, { status: 400 });
  }
  if (callback.queueName !== bound.topic && callback.queueName !== bound.replayTopic) {
    // A trigger pointing at the wrong route: never acknowledge what nobody processed.
    const message = `route bound to ${bound.consumer.queue} (topic ${bound.topic}) got a message of topic ${callback.queueName}; check vercel.json`;
    ctx.logger.error(message);
    return Response.json({ error: message }, { status: 500 });
  }
  // Follow-up calls go to the region the message lives in.
  const api = callback.region ? bound.api.withRegion(callback.region) : bound.api;
  const lane: Lane = { ...bound, api, topic: callback.queueName, group: callback.consumerGroup };
  let outcome: Outcome;
  try {
    if ("receiptHandle" in callback) {
      // Inline: the body came with the callback. Nothing authenticates the
      // request, so the handler runs only once the service confirms the
      // lease (`LeaseRunner.consume` with confirm).
      if (!callback.rawBody) return Response.json({ error: "callback without a body" }, { status: 400 });
      const payload = await rawTransport.deserialize(callback.rawBody);
      const message: QueueMessage = {
        messageId: callback.messageId,
        // Unsaid (no header): not a count; the adapter then never waits on the service's redelivery.
        deliveryCount: callback.deliveryCount ?? Number.NaN,
        createdAt: callback.createdAt ? new Date(callback.createdAt) : new Date(ctx.clock.now()),
        expiresAt: callback.expiresAt ? new Date(callback.expiresAt) : undefined,
        receiptHandle: callback.receiptHandle,
        payload,
      };
      outcome = await ctx.lease.consume(lane, message, true);
    } else {
      // Routing only: the message (and its lease) come from the service itself.
      let received: { message: QueueMessage };
      try {
        received = await api.receiveMessageById({
          queueName: lane.topic,
          consumerGroup: lane.group,
          messageId: callback.messageId,
          visibilityTimeoutSeconds: ctx.config.visibilityTimeoutSeconds,
        });
      } catch (error) {
        const name = errorName(error);
        if (name === "MessageNotAvailableError" || name === "MessageAlreadyProcessedError") {
          return Response.json({ status: "skipped", reason: name });
        }
        throw error;
      }
      outcome = await ctx.lease.consume(lane, received.message, false);
    }
  } catch (error) {
    ctx.logger.error(`${bound.consumer.name}: push delivery failed: ${describeError(error)}`);
    return Response.json({ error: "Failed to process queue message" }, { status: 500 });
  }
  if (outcome === "done") return Response.json({ status: "success" });
  if (outcome === "skipped") return Response.json({ status: "skipped" });
  // Not acknowledged, or the directive failed: a 500 shows in the platform's
  // logs, and the service redelivers after the trigger's retryAfterSeconds.
  return Response.json({ error: outcome }, { status: 500 });
}
