/**
 * What the module's tests share: the module on a test database, the real
 * Resend SDK pointed at a fake server through RESEND_BASE_URL, a manual clock
 * (backoff, deferrals and rate-limit waits take no real time: `settle()`
 * moves the clock to each next due delivery), and every delivery recorded.
 */
import { createManualClock, type ManualClock } from "@softcrum/core";
import type { DeliveryEvent } from "@softcrum/core/adapters/memory";
import type { TestDatabase } from "@softcrum/core/testing";
import {
  createNotificationsModule,
  type NotificationsModule,
  type NotificationsModuleOptions,
} from "../src/composition-root.ts";
import { addContacts } from "../src/contacts.ts";
import { type FakeResend, startFakeResend } from "./fake-resend.ts";

export const quietLogger = { warn: () => {}, error: () => {} };

export interface TestModule {
  readonly fake: FakeResend;
  readonly clock: ManualClock;
  readonly module: NotificationsModule;
  readonly deliveries: DeliveryEvent[];
  close(): Promise<void>;
}

export async function startTestModule(
  pg: TestDatabase,
  options: Partial<NotificationsModuleOptions> = {},
): Promise<TestModule> {
  const fake = await startFakeResend();
  // The SDK reads its base URL from the environment when the client is made.
  process.env["RESEND_BASE_URL"] = fake.url;
  const clock = createManualClock();
  const module = await createNotificationsModule({
    databaseUrl: pg.url,
    resendApiKey: fake.apiKey,
    clock,
    logger: quietLogger,
    ...options,
  });
  const deliveries: DeliveryEvent[] = [];
  module.queue.onDelivery((event) => deliveries.push(event));
  return {
    fake,
    clock,
    module,
    deliveries,
    async close() {
      await module.close();
      await fake.close();
    },
  };
}

/** `n` contacts `<prefix>-00000@example.com`, … for `tenantId`. */
export function seedContacts(pg: TestDatabase, tenantId: string, n: number, prefix = "c"): Promise<number> {
  return addContacts(
    pg.db,
    tenantId,
    Array.from({ length: n }, (_, i) => ({ email: `${prefix}-${String(i).padStart(5, "0")}@example.com` })),
  );
}

export const message = {
  from: "Acme News <news@acme.example>",
  subject: "Our winter sale",
  html: "<p>Everything half off.</p>",
  text: "Everything half off.",
};

/** The outcomes of one consumer's deliveries, in order. */
export function outcomesOf(deliveries: readonly DeliveryEvent[], consumer: string): string[] {
  return deliveries.filter((d) => d.consumer === consumer).map((d) => d.result.outcome);
}
