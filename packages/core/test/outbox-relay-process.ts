// An outbox relay process for the crash test: its queue port prints each
// message it publishes ("PUBLISHED <queue> <body>") and then the process
// SIGKILLs itself — after the publish, before the relay marks the row.
//   outbox-relay-process.ts DATABASE_URL
import { drizzle } from "drizzle-orm/postgres-js";
import postgres from "postgres";
import { createOutboxRelay } from "../src/outbox/index.ts";

const [url] = process.argv.slice(2);
if (!url) {
  console.error("usage: outbox-relay-process.ts DATABASE_URL");
  process.exit(2);
}
const sql = postgres(url, { max: 1, onnotice: () => {} });
const relay = createOutboxRelay({
  db: drizzle({ client: sql }),
  queue: {
    async publish(queue, payload) {
      // Written synchronously, so the line is out before the kill.
      process.stdout.write(`PUBLISHED ${queue} ${JSON.stringify(payload)}\n`);
      process.kill(process.pid, "SIGKILL");
      return { messageId: null, stored: true };
    },
  },
});
await relay.run();
console.log("NOT KILLED");
await sql.end();
