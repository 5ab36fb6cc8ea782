// Seeded randomness for the chaos run: every choice the run makes comes from
// the seed printed at its start, so `pnpm chaos --seed N` makes the same
// choices again (the timing of processes and of Postgres is the machine's).
import { createHash } from "node:crypto";

/** A seeded generator (mulberry32): `next()` in [0, 1). */
export interface Random {
  next(): number;
  /** An integer in [min, max]. */
  int(min: number, max: number): number;
  /** True with probability p. */
  chance(p: number): boolean;
  pick<T>(items: readonly T[]): T;
}

export function seeded(seed: number): Random {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
  return {
    next,
    int: (min, max) => min + Math.floor(next() * (max - min + 1)),
    chance: (p) => next() < p,
    pick: (items) => items[Math.floor(next() * items.length)] as (typeof items)[number],
  };
}

/**
 * A number in [0, 1) fixed by the seed and the parts: the same job on the
 * same attempt meets the same fault in whichever worker process runs it.
 */
export function roll(seed: number, ...parts: (string | number)[]): number {
  const digest = createHash("sha256")
    .update(`${seed}|${parts.join("|")}`)
    .digest();
  return digest.readUInt32BE(0) / 4_294_967_296;
}
