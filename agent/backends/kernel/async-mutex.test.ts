// Tests for AsyncMutex: one callback at a time, call order kept, a failure released and isolated.
import { expect, test } from "bun:test";
import { AsyncMutex } from "./async-mutex.ts";

test("callbacks run one at a time in call order, and errors stay with their caller", async () => {
  const m = new AsyncMutex();
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
