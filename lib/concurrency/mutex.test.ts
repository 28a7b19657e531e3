// Tests for Mutex: one callback at a time, call order kept, a failure released and isolated.
import { expect, test } from "bun:test";
import { Mutex } from "./mutex.ts";

test("callbacks run one at a time in call order, and errors stay with their caller", async () => {
  const m = new Mutex();
  const events: string[] = [];
  let inside = 0;
  const job = (name: string, fail = false) =>
    m.run(async () => {
      inside++;
      expect(inside).toBe(1);
      events.push(`start ${name}`);
      await new Promise((r) => setTimeout(r, 2));
      events.push(`end ${name}`);
      inside--;
      if (fail) throw new Error(`boom ${name}`);
      return name;
    });
  const results = await Promise.allSettled([job("a"), job("b", true), job("c")]);
  expect(results.map((r) => (r.status === "fulfilled" ? r.value : (r.reason as Error).message))).toEqual([
    "a",
    "boom b",
    "c",
  ]);
  expect(events).toEqual(["start a", "end a", "start b", "end b", "start c", "end c"]);
});

test("a callback that throws synchronously is contained like a rejection", async () => {
  const m = new Mutex();
  const bad = m.run((() => {
    throw new Error("sync");
  }) as () => Promise<void>);
  await expect(bad).rejects.toThrow("sync");
  expect(await m.run(async () => 1)).toBe(1);
});
