/**
 * Names: our queue and consumer names mapped reversibly to Vercel topic and
 * consumer-group names ([A-Za-z0-9_-]+), and each consumer's replay topic.
 */
import { InvalidConfigError } from "../../errors.ts";

/**
 * Maps a queue or consumer name to a Vercel topic / consumer-group name, the
 * way Vercel encodes route files as consumer groups: `_` → `__`, `.` → `_D`,
 * `:` → `_3A`. Throws `InvalidConfigError` for a name it cannot map.
 */
export function toVercelTopic(name: string): string {
  if (typeof name !== "string" || name.length === 0) {
    throw new InvalidConfigError(`cannot map ${JSON.stringify(name)} to a Vercel topic: it must be a non-empty string`);
  }
  let out = "";
  for (const ch of name) {
    if (/[A-Za-z0-9-]/.test(ch)) out += ch;
    else if (ch === "_") out += "__";
    else if (ch === ".") out += "_D";
    else if (ch === ":") out += "_3A";
    else {
      throw new InvalidConfigError(
        `cannot map ${JSON.stringify(name)} to a Vercel topic: ${JSON.stringify(ch)} is not one of letters, digits, . _ : -`,
      );
    }
  }
  return out;
}

/**
 * The replay topic of one consumer of a queue (#10 item 3): replays travel
 * apart from live traffic, on a topic only that consumer reads, with the
 * letter's bytes unwrapped. `_R` never occurs in a name `toVercelTopic` makes,
 * so no queue's topic can collide with a replay topic.
 */
export function toVercelReplayTopic(queue: string, consumer: string): string {
  return `${toVercelTopic(queue)}_R${toVercelTopic(consumer)}`;
}

/** The inverse of `toVercelTopic`. Throws `InvalidConfigError` for a topic it did not make. */
export function fromVercelTopic(topic: string): string {
  let out = "";
  for (let i = 0; i < topic.length; i++) {
    const ch = topic[i] as string;
    if (ch !== "_") {
      if (!/[A-Za-z0-9-]/.test(ch)) break;
      out += ch;
      continue;
    }
    const next = topic[i + 1];
    if (next === "_") out += "_";
    else if (next === "D") out += ".";
    else if (next === "3" && topic[i + 2] === "A") {
      out += ":";
      i += 1;
    } else throw new InvalidConfigError(`${JSON.stringify(topic)} is not a topic made by toVercelTopic`);
    i += 1;
  }
  if (out.length === 0 || toVercelTopic(out) !== topic) {
    throw new InvalidConfigError(`${JSON.stringify(topic)} is not a topic made by toVercelTopic`);
  }
  return out;
}
