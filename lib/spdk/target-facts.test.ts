// TargetFacts: a fact is reused only on the connection it was verified over, within its TTL and
// until forgotten; failed, straddling or forgotten-while-running checks record nothing.
import { expect, test } from "bun:test";
import { ManualClock } from "../clock.ts";
import type { SpdkRpc } from "./client.ts";
import { TargetFacts } from "./target-facts.ts";

/** An SpdkRpc whose connection generation the test sets; the facts never call it. */
function fakeRpc(generation: number | undefined = 1): SpdkRpc & { connectionGeneration: number | undefined } {
  return {
    connectionGeneration: generation,
    call: async () => {
      throw new Error("not used");
    },
    serialize: (_key, fn) => fn(),
  };
}

function counting<T>(value: T): { check: () => Promise<T>; runs: () => number } {
  let n = 0;
  return {
    check: async () => {
      n++;
      return value;
    },
    runs: () => n,
  };
}

test("a fact is checked once and reused while the connection stays the same", async () => {
  const rpc = fakeRpc(1);
  const facts = new TargetFacts({ rpc, clock: new ManualClock() });
  const c = counting("nvme_0n1");
  for (let i = 0; i < 5; i++) expect(await facts.verified("controller", c.check)).toBe("nvme_0n1");
  expect(c.runs()).toBe(1);
  expect(facts.known("controller")).toBe(true);
});

test("a new connection (a restarted target) is checked again", async () => {
  const rpc = fakeRpc(1);
  const facts = new TargetFacts({ rpc, clock: new ManualClock() });
  const c = counting(true);
  await facts.verified("transport", c.check);
  rpc.connectionGeneration = undefined; // dropped: nothing is trusted until a new one answers
  expect(facts.known("transport")).toBe(false);
  rpc.connectionGeneration = 2;
  await facts.verified("transport", c.check);
  await facts.verified("transport", c.check);
  expect(c.runs()).toBe(2);
});

test("a check that did not run over one established connection records nothing", async () => {
  const rpc = fakeRpc(undefined);
  const facts = new TargetFacts({ rpc, clock: new ManualClock() });
  await facts.verified("k", async () => {
    rpc.connectionGeneration = 3; // connected during the check
    return 1;
  });
  expect(facts.known("k")).toBe(false);
  await facts.verified("k", async () => {
    rpc.connectionGeneration = 4; // reconnected during the check
    return 1;
  });
  expect(facts.known("k")).toBe(false);
  await facts.verified("k", async () => 1);
  expect(facts.known("k")).toBe(true);
});

test("facts lapse after the TTL", async () => {
  const clock = new ManualClock();
  const facts = new TargetFacts({ rpc: fakeRpc(1), clock, ttlMs: 1000 });
  const c = counting(0);
  await facts.verified("k", c.check);
  clock.advance(999);
  await facts.verified("k", c.check);
  clock.advance(1);
  await facts.verified("k", c.check);
  expect(c.runs()).toBe(2);
});

test("a failed check records nothing and is not shared with later callers", async () => {
  const facts = new TargetFacts({ rpc: fakeRpc(1), clock: new ManualClock() });
  await expect(
    facts.verified("k", async () => {
      throw new Error("boom");
    }),
  ).rejects.toThrow("boom");
  expect(facts.known("k")).toBe(false);
  expect(await facts.verified("k", async () => 7)).toBe(7);
});

test("concurrent callers share one check", async () => {
  const facts = new TargetFacts({ rpc: fakeRpc(1), clock: new ManualClock() });
  let release: (v: string) => void = () => {};
  let runs = 0;
  const check = () => {
    runs++;
    return new Promise<string>((r) => {
      release = r;
    });
  };
  const all = Promise.all([
    facts.verified("k", check),
    facts.verified("k", check),
    facts.verified("k", check),
  ]);
  release("v");
  expect(await all).toEqual(["v", "v", "v"]);
  expect(runs).toBe(1);
});

test("a check running when its key is forgotten is not recorded, and later callers do not join it", async () => {
  const facts = new TargetFacts({ rpc: fakeRpc(1), clock: new ManualClock() });
  let release: () => void = () => {};
  let runs = 0;
  const slow = () => {
    runs++;
    return new Promise<void>((r) => {
      release = r;
    });
  };
  const first = facts.verified("keys", slow);
  const releaseFirst = release;
  facts.forget("keys");
  const second = facts.verified("keys", slow);
  expect(runs).toBe(2);
  releaseFirst();
  await first;
  expect(facts.known("keys")).toBe(false);
  release();
  await second;
  expect(facts.known("keys")).toBe(true);
});

test("forget() drops every fact; forgetOnError forgets them when the operation fails", async () => {
  const facts = new TargetFacts({ rpc: fakeRpc(1), clock: new ManualClock() });
  await facts.verified("a", async () => 1);
  await facts.verified("b", async () => 2);
  expect(await facts.forgetOnError(async () => "ok")).toBe("ok");
  expect(facts.known("a") && facts.known("b")).toBe(true);
  await expect(
    facts.forgetOnError(async () => {
      throw new Error("listener refused");
    }),
  ).rejects.toThrow("listener refused");
  expect(facts.known("a") || facts.known("b")).toBe(false);
  await facts.verified("a", async () => 1);
  facts.forget();
  expect(facts.known("a")).toBe(false);
});
