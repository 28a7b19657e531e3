// Tests for KeyedMutex: one callback per key at a time, keys independent, failures released.
import { expect, test } from "bun:test";
import { KeyedMutex } from "./keyed-mutex.ts";

const tick = () => new Promise((r) => setTimeout(r, 1));

test("same key runs in order, one at a time; other keys overlap; keys are forgotten when idle", async () => {
  const m = new KeyedMutex();
  const log: string[] = [];
  const active = new Map<string, number>();
  const job = (key: string, name: string, fail = false) =>
    m.run(key, async () => {
      active.set(key, (active.get(key) ?? 0) + 1);
      expect(active.get(key)).toBe(1);
      log.push(`+${name}`);
      await tick();
      log.push(`-${name}`);
      active.set(key, (active.get(key) ?? 0) - 1);
      if (fail) throw new Error(name);
    });
  const all = Promise.allSettled([job("a", "a1", true), job("b", "b1"), job("a", "a2")]);
  expect(m.busyKeys).toBe(2);
  const results = await all;
  expect(results.map((r) => r.status)).toEqual(["rejected", "fulfilled", "fulfilled"]);
  // a2 waited for a1; b1 ran alongside a1.
  expect(log.indexOf("-a1")).toBeLessThan(log.indexOf("+a2"));
  expect(log.indexOf("+b1")).toBeLessThan(log.indexOf("-a1"));
  await tick();
  expect(m.busyKeys).toBe(0);
});
