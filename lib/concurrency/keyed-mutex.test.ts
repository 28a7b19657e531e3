// KeyedMutex: FIFO order and exclusion per key under contention, concurrency across keys, release
// after failure, and idle keys forgotten.

import { expect, test } from "bun:test";
import { seededRandom } from "../seeded-random.ts";
import { KeyedMutex } from "./keyed-mutex.ts";

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("tasks under one key run one at a time, in arrival order, under contention", async () => {
  const mutex = new KeyedMutex();
  const random = seededRandom(7);
  const log: string[] = [];
  let running = 0;
  let maxRunning = 0;
  const tasks = Array.from({ length: 40 }, (_, i) =>
    mutex.run("nqn-a", async () => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      log.push(`start ${i}`);
      await tick(Math.floor(random() * 3));
      log.push(`end ${i}`);
      running--;
      return i;
    }),
  );
  expect(await Promise.all(tasks)).toEqual(Array.from({ length: 40 }, (_, i) => i));
  expect(maxRunning).toBe(1);
  expect(log).toEqual(Array.from({ length: 40 }, (_, i) => [`start ${i}`, `end ${i}`]).flat());
  expect(mutex.heldKeys).toBe(0);
});

test("tasks under different keys overlap", async () => {
  const mutex = new KeyedMutex();
  let running = 0;
  let maxRunning = 0;
  const task = (key: string) =>
    mutex.run(key, async () => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      await tick(5);
      running--;
    });
  await Promise.all([task("a"), task("b"), task("c")]);
  expect(maxRunning).toBe(3);
});

test("a failing task passes its error on and releases the key for the next", async () => {
  const mutex = new KeyedMutex();
  const order: string[] = [];
  const failing = mutex.run("k", async () => {
    order.push("first");
    throw new Error("boom");
  });
  const next = mutex.run("k", async () => {
    order.push("second");
    return "ok";
  });
  await expect(failing).rejects.toThrow("boom");
  expect(await next).toBe("ok");
  expect(order).toEqual(["first", "second"]);
  expect(mutex.heldKeys).toBe(0);
});

test("a task that throws synchronously is contained like a rejection", async () => {
  const mutex = new KeyedMutex();
  const bad = mutex.run("k", (() => {
    throw new Error("sync");
  }) as () => Promise<void>);
  await expect(bad).rejects.toThrow("sync");
  expect(await mutex.run("k", async () => 1)).toBe(1);
});

test("same key runs in order, one at a time; other keys overlap; keys are forgotten when idle", async () => {
  const m = new KeyedMutex();
  const log: string[] = [];
  const active = new Map<string, number>();
  const job = (key: string, name: string, fail = false) =>
    m.run(key, async () => {
      active.set(key, (active.get(key) ?? 0) + 1);
      expect(active.get(key)).toBe(1);
      log.push(`+${name}`);
      await tick(1);
      log.push(`-${name}`);
      active.set(key, (active.get(key) ?? 0) - 1);
      if (fail) throw new Error(name);
    });
  const all = Promise.allSettled([job("a", "a1", true), job("b", "b1"), job("a", "a2")]);
  expect(m.heldKeys).toBe(2);
  expect([m.pending("a"), m.pending("b"), m.pending("c")]).toEqual([2, 1, 0]);
  const results = await all;
  expect(results.map((r) => r.status)).toEqual(["rejected", "fulfilled", "fulfilled"]);
  // a2 waited for a1; b1 ran alongside a1.
  expect(log.indexOf("-a1")).toBeLessThan(log.indexOf("+a2"));
  expect(log.indexOf("+b1")).toBeLessThan(log.indexOf("-a1"));
  await tick(1);
  expect(m.heldKeys).toBe(0);
  expect([m.pending("a"), m.pending("b")]).toEqual([0, 0]);
});

test("serialises per key, runs keys concurrently, survives failures, forgets idle keys", async () => {
  const m = new KeyedMutex();
  const log: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const a1 = m.run("a", async () => {
    log.push("a1 start");
    await gate;
    log.push("a1 end");
    throw new Error("boom");
  });
  const a2 = m.run("a", async () => {
    log.push("a2");
    return 2;
  });
  const b1 = m.run("b", async () => {
    log.push("b1");
    return 1;
  });
  expect(await b1).toBe(1);
  expect(log).toEqual(["a1 start", "b1"]);
  release();
  await expect(a1).rejects.toThrow("boom");
  expect(await a2).toBe(2);
  expect(log).toEqual(["a1 start", "b1", "a1 end", "a2"]);
  await Bun.sleep(0);
  expect(m.heldKeys).toBe(0);
});
