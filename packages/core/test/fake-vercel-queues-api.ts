/**
 * The fake Vercel Queues server's API for tests: its constants, what it records,
 * the faults it can be told to answer with, and `chaosFaults` for a chaos run.
 * The server itself is `fake-vercel-queues.ts`, which re-exports all of this.
 */
import type { ManualClock } from "../src/clock.ts";

export const FAKE_TOKEN = "test";
/** The wrapper secret every adapter of a test shares (the adapter signs its deferrals with it). */
export const TEST_QUEUE_SECRET = "test-queue-secret-of-at-least-32-characters";
export const FAKE_REGION = "iad1";
/** The service's documented largest message (100 MB). */
export const FAKE_MAX_MESSAGE_BYTES = 100_000_000;

export interface RecordedSend {
  /** Position among every recorded send and lease call, to check what happened first. */
  readonly order: number;
  readonly topic: string;
  readonly region: string;
  /** `Vqs-Deployment-Id` of the send; null when unpinned. */
  readonly deploymentId: string | null;
  /**
   * The id of the message stored (for a 202, which answers none, the id it was
   * stored under), the fresh id answered for a duplicate, or "" when nothing
   * was stored (a refused send).
   */
  readonly messageId: string;
  readonly idempotencyKey: string | undefined;
  readonly delaySeconds: number | undefined;
  readonly retentionSeconds: number | undefined;
  /** True when the idempotency key matched an earlier send: nothing new was stored. */
  readonly deduplicated: boolean;
  /** The HTTP status answered (201, or an injected fault's). */
  readonly status: number;
  readonly body: Buffer;
}

export interface RecordedLeaseCall {
  readonly order: number;
  readonly method: "PATCH" | "DELETE";
  readonly topic: string;
  readonly group: string;
  readonly messageId: string;
  /** PATCH only. */
  readonly visibilityTimeoutSeconds?: number;
  readonly status: number;
  /** False when an injected fault answered without applying the call. */
  readonly applied: boolean;
}

export interface RecordedCallback {
  readonly topic: string;
  readonly group: string;
  readonly messageId: string;
  readonly deliveryCount: number;
  readonly status: number;
}

export interface RecordedReceive {
  readonly topic: string;
  readonly group: string;
  readonly region: string;
  readonly deploymentId: string | null;
  readonly cursorFallback: string | undefined;
  readonly status: number;
}

export interface RecordedDrop {
  readonly topic: string;
  readonly group: string;
  readonly messageId: string;
  readonly deliveryCount: number;
  /** `max_deliveries`: the subscription's cap was reached; `expired`: retention ended. */
  readonly reason: "max_deliveries" | "expired";
}

/** An answer a fault gives instead of the normal one. */
export interface FakeReply {
  readonly status: number;
  /** Seconds, sent as `Retry-After` (429). */
  readonly retryAfter?: number;
  /** Sent as `Vqs-Error-Code` (502 `consumer_discovery_failed`). */
  readonly errorCode?: string;
  /** 202 only: false when the "deferred processing" never stores the message (the pessimistic answer). @default true */
  readonly store?: boolean;
  /**
   * Sends only: wait this long (real ms) before going on, as the status says
   * (201: store and answer the id): a client that gives up first saw a
   * timeout of a send that was stored all the same.
   */
  readonly delayMs?: number;
  /**
   * Sends only: close the connection without an answer, `before` storing the
   * message or `after` storing it (with status 201). Recorded as status 0.
   */
  readonly dropConnection?: "before" | "after";
  /**
   * Sends only, a 2xx status: answer this JSON body instead, storing nothing
   * (a 200 `{}`, a 201 with an empty id: what a client must not read as stored).
   */
  readonly body?: unknown;
}

export interface FakeFaults {
  /** Called for every send before it is stored: a reply to answer instead (202 stores the message and answers no id). */
  send?(send: {
    readonly topic: string;
    readonly body: Buffer;
    readonly idempotencyKey: string | undefined;
  }): FakeReply | undefined;
  /**
   * Called for every ack (DELETE) and visibility change (PATCH) on a valid
   * lease: a reply to answer instead; with `apply: true` the call takes
   * effect anyway (a lost response). May wait (a slow call).
   */
  leaseCall?(call: {
    readonly method: "PATCH" | "DELETE";
    readonly topic: string;
    readonly group: string;
    readonly messageId: string;
    readonly visibilityTimeoutSeconds?: number;
  }):
    | (FakeReply & { readonly apply?: boolean })
    | undefined
    | Promise<(FakeReply & { readonly apply?: boolean }) | undefined>;
  /** After a lease is granted or moved: how many ms earlier than asked the message becomes visible again (an early redelivery). */
  earlyRedeliveryMs?(lease: { readonly topic: string; readonly group: string; readonly messageId: string }): number;
}

export interface FakeVercelQueuesOptions {
  /** Epoch ms the manual clock starts at. @default Date.now() */
  readonly start?: number;
  /** Largest body a send accepts; a larger one is answered 413. @default FAKE_MAX_MESSAGE_BYTES */
  readonly maxMessageBytes?: number;
  /** `approximate`: what is visible comes in a seeded random order; `fifo`: oldest first. @default "approximate" */
  readonly order?: "approximate" | "fifo";
  /** Seed of the approximate order. @default 1 */
  readonly seed?: number;
  /** How unpinned consumers and pinned messages meet: `docs` (an unpinned poller sees every deployment) or `strict` (neither sees the other). @default "docs" */
  readonly deployments?: "docs" | "strict";
  /** Where a new poll consumer group starts when the receive names no `Vqs-Cursor-Fallback`. @default "earliest" */
  readonly cursorDefault?: "earliest" | "latest";
  /** `uuid`, or `sequence`: per-partition counters (`0-1`, `0-2` …) that repeat across deployments. @default "uuid" */
  readonly messageIds?: "uuid" | "sequence";
  /** The cap of a poll consumer group's deliveries (push subscriptions set their own). @default unbounded */
  readonly pollMaxDeliveries?: number;
  readonly faults?: FakeFaults;
}

export interface SubscribePushOptions {
  /** @default `app_Sapi_Squeues_S{topic}_Sroute_Dts` */
  readonly group?: string;
  /** The trigger's wait after a failed callback. @default 60 */
  readonly retryAfterSeconds?: number;
  /** The trigger's `maxDeliveries`: the message is dropped once this many deliveries are spent. @default 32 (as `vercel dev`) */
  readonly maxDeliveries?: number;
  /** The first lease of a push callback (server-assigned, `ce-vqsvisibilitydeadline`). @default 60 */
  readonly leaseSeconds?: number;
  /** @deprecated the old name of `leaseSeconds` */
  readonly visibilityTimeoutSeconds?: number;
  readonly mode?: "inline" | "by-id";
  /** Region of the route (its messages must have been sent there). @default FAKE_REGION */
  readonly region?: string;
  /** Deployment of the route: it gets the messages pinned to it (and unpinned ones, unless `strict`). null: every partition. @default null */
  readonly deploymentId?: string | null;
}

export interface FakeVercelQueues {
  readonly url: string;
  readonly clock: ManualClock;
  readonly sends: readonly RecordedSend[];
  readonly leaseCalls: readonly RecordedLeaseCall[];
  readonly callbacks: readonly RecordedCallback[];
  readonly receives: readonly RecordedReceive[];
  /** Messages the service dropped (cap reached or expired) before a group acknowledged them: lost jobs. */
  readonly drops: readonly RecordedDrop[];
  /** Faults in force; assign or replace hooks at any time. */
  faults: FakeFaults;
  /** What to give the SDK (or `createVercelQueue`) to talk to this server, unpinned, in `region`. */
  clientOptions(region?: string): {
    region: string;
    token: string;
    deploymentId: null;
    resolveBaseUrl: (region: string) => URL;
    /** The tests' wrapper secret (`TEST_QUEUE_SECRET`): the adapter's, not the service's. */
    wrapperSecret: string;
  };
  /** Stores a message as if a producer on another stack had sent these bytes (no validation). */
  inject(
    topic: string,
    body: string | Uint8Array,
    options?: {
      retentionSeconds?: number;
      delaySeconds?: number;
      region?: string;
      deploymentId?: string | null;
      contentType?: string;
    },
  ): string;
  /** Delivers `topic` to `route` as consumer group `group` whenever `dispatch()` runs. */
  subscribePush(topic: string, route: (request: Request) => Promise<Response>, options?: SubscribePushOptions): void;
  /** Sets a poll consumer group's delivery cap. */
  setMaxDeliveries(topic: string, group: string, maxDeliveries: number | undefined, region?: string): void;
  /**
   * Calls the push routes for every message visible now, repeatedly, until none
   * is. Unbounded concurrency unless `concurrency` is given. Returns the callbacks made.
   */
  dispatch(options?: { concurrency?: number }): Promise<number>;
  /** Messages of `topic` not yet acknowledged by `group` (and neither dropped nor expired), in every partition. */
  pending(topic: string, group: string): number;
  /** Earliest time a known group's unacknowledged message becomes visible, or undefined. */
  nextVisibleAt(): number | undefined;
  /** The delivery count a group has reached for a message. */
  deliveryCount(topic: string, group: string, messageId: string): number | undefined;
  /** The next `n` sends answer 500. */
  failSends(n: number): void;
  /** The next sends answer these replies, one each (202 stores the message without answering its id). */
  failNextSends(...replies: FakeReply[]): void;
  /** The next `n` acks/PATCHes (of `method`, if given) answer `status` (default 500); `apply: true` applies them anyway. */
  failLeaseCalls(n: number, options?: { method?: "PATCH" | "DELETE"; status?: number; apply?: boolean }): void;
  close(): Promise<void>;
}

/**
 * Random faults for a chaos run, repeatable from `seed`: each a probability
 * per call. `lostAcks`: an acknowledgement answered 204 but not applied (the
 * message comes back when its lease ends); `failedAcks` / `failedPatches`:
 * answered 500, not applied; `lostResponses`: an ack applied but answered 502;
 * `earlyRedelivery`: a lease (a retry's wait included) ends `earlyByMs`
 * early (default: at once).
 */
export function chaosFaults(options: {
  readonly seed?: number;
  readonly lostAcks?: number;
  readonly failedAcks?: number;
  readonly failedPatches?: number;
  readonly lostResponses?: number;
  readonly earlyRedelivery?: number;
  readonly earlyByMs?: number;
}): FakeFaults {
  const random = seeded(options.seed ?? 7);
  const roll = (p: number | undefined) => p !== undefined && p > 0 && random() < p;
  return {
    leaseCall(call) {
      if (call.method === "DELETE") {
        if (roll(options.lostAcks)) return { status: 204, apply: false };
        if (roll(options.failedAcks)) return { status: 500 };
        if (roll(options.lostResponses)) return { status: 502, apply: true };
        return undefined;
      }
      return roll(options.failedPatches) ? { status: 500 } : undefined;
    },
    earlyRedeliveryMs: () => (roll(options.earlyRedelivery) ? (options.earlyByMs ?? Number.MAX_SAFE_INTEGER) : 0),
  };
}

/** A small seeded PRNG (mulberry32): the fake's order is random but repeatable. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}
