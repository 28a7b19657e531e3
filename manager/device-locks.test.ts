// KeyedMutex: one task at a time per key, in order, failures do not block the next task, and
// idle keys are forgotten.
import { expect, test } from "bun:test";
import { KeyedMutex } from "./device-locks.ts";

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
  expect(m.size).toBe(0);
});
