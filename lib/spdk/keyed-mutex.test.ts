// KeyedMutex: FIFO order and exclusion per key under contention, concurrency across keys, and
// release after failure.

import { expect, test } from "bun:test";
import { KeyedMutex } from "./keyed-mutex.ts";
import { seededRandom } from "./testing.ts";

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
