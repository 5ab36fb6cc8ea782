/**
 * Notification lanes (#20 item 2, SPEC §7): one queue per channel per lane,
 * `notif.{channel}.transactional` and `notif.{channel}.marketing`;
 * transactional always has priority. This file names and validates lane
 * queues, so every module spells them one way. The yield of a marketing
 * consumer to its channel's transactional backlog: gate.ts, backlog.ts.
 */
import { InvalidConfigError } from "../errors.ts";

export const LANES = ["transactional", "marketing"] as const;
export type Lane = (typeof LANES)[number];

const CHANNEL = /^[a-z][a-z0-9-]{0,31}$/;
const LANE_QUEUE = /^notif\.([a-z][a-z0-9-]{0,31})\.(transactional|marketing)$/;

/** The queue of `channel`'s `lane`: `laneQueue("email", "marketing")` is `notif.email.marketing`. */
export function laneQueue(channel: string, lane: Lane): string {
  if (typeof channel !== "string" || !CHANNEL.test(channel)) {
    throw new InvalidConfigError(
      `lane queue: a channel is 1-32 of a-z 0-9 -, starting with a letter (email, sms, push), got ${JSON.stringify(channel)}`,
    );
  }
  if (!(LANES as readonly string[]).includes(lane)) {
    throw new InvalidConfigError(`lane queue: the lane is "transactional" or "marketing", got ${JSON.stringify(lane)}`);
  }
  return `notif.${channel}.${lane}`;
}

/** The channel and lane a queue name is for, or undefined for a queue that is not a lane's. */
export function parseLaneQueue(queue: string): { readonly channel: string; readonly lane: Lane } | undefined {
  const m = typeof queue === "string" ? LANE_QUEUE.exec(queue) : null;
  return m ? { channel: m[1] as string, lane: m[2] as Lane } : undefined;
}
