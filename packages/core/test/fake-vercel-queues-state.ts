/** The fake Vercel Queues server's own state: its stored messages, leases and subscriptions (not for tests to read). */
export interface StoredMessage {
  readonly key: string;
  readonly id: string;
  readonly seq: number;
  readonly region: string;
  readonly deploymentId: string | null;
  readonly topic: string;
  readonly body: Buffer;
  readonly contentType: string;
  readonly createdAt: number;
  readonly availableAt: number;
  readonly expiresAt: number;
}

export interface Delivery {
  deliveryCount: number;
  visibleAt: number;
  receiptHandle: string | undefined;
  acked: boolean;
  dropped: boolean;
}

export interface GroupState {
  readonly region: string;
  readonly topic: string;
  readonly name: string;
  /** Messages stored before this sequence number are not for this group (it started at `latest`). */
  readonly fromSeq: number;
  readonly deliveries: Map<string, Delivery>; // message key → delivery
  maxDeliveries: number | undefined;
}

export interface PushSubscription {
  readonly topic: string;
  readonly group: string;
  readonly region: string;
  readonly deploymentId: string | null;
  readonly route: (request: Request) => Promise<Response>;
  readonly retryAfterSeconds: number;
  readonly leaseSeconds: number;
  /** `inline`: body and receipt handle in the callback; `by-id`: routing only, the SDK receives by id. */
  readonly mode: "inline" | "by-id";
}
