import { describe, expect, test } from "vitest";
import { LruMap } from "./lru-map.ts";

describe("LruMap", () => {
  test("keeps at most its capacity, forgetting the least recently used entry first", () => {
    const map = new LruMap<string, number>(3);
    map.set("a", 1);
    map.set("b", 2);
    map.set("c", 3);
    expect(map.get("a")).toBe(1); // "a" is now the most recently used
    map.set("d", 4);
    expect(map.size).toBe(3);
    expect(map.get("b")).toBeUndefined();
    expect([map.get("a"), map.get("c"), map.get("d")]).toEqual([1, 3, 4]);
  });

  test("setting an existing key replaces its value without growing", () => {
    const map = new LruMap<string, number>(2);
    map.set("a", 1);
    map.set("a", 2);
    map.set("b", 3);
    expect(map.size).toBe(2);
    expect(map.get("a")).toBe(2);
    expect(map.delete("a")).toBe(true);
    expect(map.get("a")).toBeUndefined();
  });

  test("refuses a capacity that is not a positive integer", () => {
    expect(() => new LruMap(0)).toThrow(RangeError);
    expect(() => new LruMap(1.5)).toThrow(RangeError);
  });
});
