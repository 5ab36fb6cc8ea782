import { eq, sql } from "drizzle-orm";
import { integer, pgTable, uuid } from "drizzle-orm/pg-core";
import { expectTypeOf, test } from "vitest";
import { z } from "zod";
import {
  defineConsumer,
  type HandlerContext,
  type OutboxReceipt,
  preparedQuery,
  type WorkTransaction,
} from "./index.ts";

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

test("batch options are typed: concurrent is a boolean, maxSize and maxWaitMs are required", () => {
  const base = { name: "t.b", queue: "t.q", kind: "k.v1", schema: z.object({}), handle: async () => {} };
  defineConsumer({ ...base, batch: { maxSize: 8, maxWaitMs: 2 } });
  defineConsumer({ ...base, batch: { maxSize: 8, maxWaitMs: 2, concurrent: true } });
  // @ts-expect-error concurrent is true or false
  defineConsumer({ ...base, batch: { maxSize: 8, maxWaitMs: 2, concurrent: "yes" } });
  // @ts-expect-error maxWaitMs is required
  defineConsumer({ ...base, batch: { maxSize: 8 } });
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

test("preparedQuery: a job's copy is what the builder's .prepare() returns, its execute typed by the query", () => {
  const ledger = pgTable("ledger", { jobId: uuid("job_id").notNull(), points: integer("points").notNull() });
  const read = preparedQuery("read_points", (tx) =>
    tx
      .select({ points: ledger.points })
      .from(ledger)
      .where(eq(ledger.jobId, sql.placeholder("jobId"))),
  );
  defineConsumer({
    name: "t.prepared",
    queue: "t.q",
    kind: "k.v1",
    schema: z.object({}),
    async handle(_data, { tx, envelope }) {
      expectTypeOf(read(tx).execute({ jobId: envelope.job_id })).resolves.toEqualTypeOf<{ points: number }[]>();
      // @ts-expect-error it binds to a work transaction, never to nothing
      read();
    },
  });
});
