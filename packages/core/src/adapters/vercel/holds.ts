/**
 * Transport holds (#19): a delivery the adapter keeps on its lease without
 * spending an attempt (its successor is not known stored) is recorded in the
 * consumer's hold store (`BoundConsumer.holds`) under the message's name
 * (`messageKey`), so the next delivery of that message is not counted as
 * an attempt, and a successor that arrives marks its predecessor done.
 */
import { createHash } from "node:crypto";
import { describeError } from "../../errors.ts";
import type { Action, DeliveryContext, Lane } from "./lane.ts";
import type { QueueMessage } from "./service.ts";

export const sha256 = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");

/**
 * A message's name in the transport-hold store (`BoundConsumer.holds`): its
 * identity on the service — topic, id and send time, since ids are opaque
 * and their uniqueness across partitions is undocumented.
 */
export function messageKey(topic: string, message: { readonly messageId: string; readonly createdAt: Date }): string {
  return sha256(JSON.stringify([topic, message.messageId, message.createdAt.getTime()]));
}

/**
 * Keeps a message whose successor is not known stored, without spending
 * an attempt: the hold is recorded (`BoundConsumer.holds`), so its next
 * delivery is not counted as one. A hold that cannot be recorded is an
 * incident: that delivery then counts (never a lost job, at worst an early
 * dead letter an operator replays).
 */
export async function keep(
  ctx: DeliveryContext,
  lane: Lane,
  message: QueueMessage,
  key: string,
  action: Action,
): Promise<Action> {
  const holds = lane.consumer.holds;
  if (action.kind === "ack" || holds === undefined) return action;
  try {
    await holds.record(key, message.deliveryCount);
  } catch (error) {
    unrecorded(
      ctx,
      lane,
      message,
      `delivery ${message.deliveryCount} was kept without spending an attempt, but the hold could not be recorded (${describeError(error)}): its next delivery counts as one`,
    );
  }
  return action;
}

/**
 * The acknowledgement of a delivery whose successor is known stored failed:
 * the original comes back when its lease ends, with a higher count. It is
 * recorded as a hold its successor has already taken over, so that comeback
 * goes without running (the copy carries the job) and counts as nothing.
 * Unrecorded (an incident), the comeback runs as the next attempt, and the
 * fence absorbs whichever of the two runs second.
 */
export async function superseded(ctx: DeliveryContext, lane: Lane, message: QueueMessage): Promise<void> {
  const holds = lane.consumer.holds;
  if (holds === undefined) return;
  const key = messageKey(lane.topic, message);
  try {
    await holds.record(key, message.deliveryCount);
    await holds.succeeded(key, message.deliveryCount);
  } catch (error) {
    unrecorded(
      ctx,
      lane,
      message,
      `the acknowledgement of delivery ${message.deliveryCount} failed after the copy carrying its job was stored, and the hold that lets its comeback go could not be recorded (${describeError(error)}): its next delivery counts as an attempt`,
    );
  }
}

/** A hold that could not be recorded or read: the incident that says which delivery now counts as an attempt. */
function unrecorded(ctx: DeliveryContext, lane: Lane, message: QueueMessage, text: string): void {
  ctx.incidents.report({
    kind: "hold_unrecorded",
    queue: lane.consumer.queue,
    consumer: lane.consumer.name,
    messageId: message.messageId,
    message: text,
    alert: false,
  });
}

/** The holds of earlier deliveries of this message; none known when they cannot be read (an incident). */
export async function keptBefore(
  ctx: DeliveryContext,
  lane: Lane,
  message: QueueMessage,
  key: string,
): Promise<{ readonly holds: number; readonly succeeded: boolean } | undefined> {
  const holds = lane.consumer.holds;
  if (holds === undefined) return undefined;
  try {
    return await holds.before(key, message.deliveryCount);
  } catch (error) {
    unrecorded(
      ctx,
      lane,
      message,
      `the holds of message ${message.messageId} could not be read (${describeError(error)}): delivery ${message.deliveryCount} counts every earlier one as an attempt`,
    );
    return undefined;
  }
}

/** Marks the delivery `origin` names as succeeded by this copy; best effort (its predecessor then just runs again). */
export async function successorArrived(
  ctx: DeliveryContext,
  lane: Lane,
  message: QueueMessage,
  origin: string,
): Promise<void> {
  const holds = lane.consumer.holds;
  const at = origin.lastIndexOf(":");
  const count = Number(origin.slice(at + 1));
  if (holds === undefined || at <= 0 || !Number.isSafeInteger(count)) return;
  try {
    await holds.succeeded(origin.slice(0, at), count);
  } catch (error) {
    ctx.logger.warn(
      `${lane.consumer.name}: could not mark the predecessor of message ${message.messageId} (${describeError(error)}); it runs again when it comes back`,
    );
  }
}
