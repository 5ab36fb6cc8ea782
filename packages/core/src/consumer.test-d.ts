import { expectTypeOf, test } from "vitest";
import { z } from "zod";
import { defineConsumer, type HandlerContext, type OutboxReceipt, type WorkTransaction } from "./index.ts";

test("the handler's data is the output type of the consumer's schema", () => {
  defineConsumer({
    name: "t.award",
    queue: "t.points",
    kind: "points.award.v1",
    schema: z.object({ customerId: z.string(), points: z.coerce.number() }),
    async handle(data, ctx) {
      expectTypeOf(data).toEqualTypeOf<{ customerId: string; points: number }>();
      expectTypeOf(ctx).toEqualTypeOf<HandlerContext>();
      expectTypeOf(ctx.tx).toEqualTypeOf<WorkTransaction>();
      expectTypeOf(ctx.idempotencyKey).toBeString();
      expectTypeOf(ctx.outbox.publish).returns.resolves.toEqualTypeOf<OutboxReceipt>();
    },
    orderingKey: (data) => data.customerId,
  });
});

test("a handler must return a promise and the schema must be given", () => {
  defineConsumer({
    name: "t.x",
    queue: "t.q",
    kind: "k.v1",
    schema: z.object({}),
    // @ts-expect-error a handler is async
    handle: () => 1,
  });
  // @ts-expect-error schema is required
  defineConsumer({ name: "t.y", queue: "t.q", kind: "k.v1", handle: async () => {} });
});
