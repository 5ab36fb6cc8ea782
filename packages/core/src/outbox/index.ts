// `@softcrum/core/outbox`: the relay that publishes committed outbox rows.
// Writing to the outbox is on the root (`ctx.outbox`, `outboxIn(tx)`).
export type { OutboxRelay, OutboxRelayOptions, OutboxRelayReport } from "./relay.ts";
export { createOutboxRelay } from "./relay.ts";
