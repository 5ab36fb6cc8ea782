// Writes apps/loyalty/vercel.json from the consumer definitions (src/vercel-triggers.ts).
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { loyaltyVercelJson } from "../src/vercel-triggers.ts";

const target = fileURLToPath(new URL("../vercel.json", import.meta.url));
writeFileSync(target, `${JSON.stringify(loyaltyVercelJson(), null, 2)}\n`);
console.log(`wrote ${target}`);
