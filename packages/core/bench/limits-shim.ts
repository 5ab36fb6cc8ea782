/**
 * The Upstash REST shim (test/upstash-shim.ts) in a process of its own, for
 * bench/limits.bench.ts: "Upstash" is not in the process where the fake
 * provider stamps arrivals, so the hundreds of takes a second it serves do
 * not delay those stamps. Prints one line `SHIM <url> <token>`; when its stdin
 * ends, deletes the keys under PREFIX, closes and exits.
 */
import { startUpstashShim } from "../test/upstash-shim.ts";

const [prefix] = process.argv.slice(2);
if (!prefix) {
  console.error("usage: limits-shim.ts PREFIX");
  process.exit(2);
}
const shim = await startUpstashShim();
console.log(`SHIM ${shim.url} ${shim.token}`);
process.stdin.resume();
process.stdin.on("end", async () => {
  await shim.deleteKeys(`${prefix}:*`);
  await shim.close();
  process.exit(0);
});
