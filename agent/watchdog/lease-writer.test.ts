import { expect, test } from "bun:test";
import { createLogger } from "../../lib/log.ts";
import type { Lease } from "./lease.ts";
import { LeaseWriter } from "./lease-writer.ts";

const lease = (heartbeatMs: number): Lease => ({
  version: 1,
  node: "n1",
  heartbeatMs,
  fenceAtMs: heartbeatMs + 3000,
  nqns: ["nqn.a"],
});

test("writes coalesce to the newest lease, never an older one after a newer, and a repeat is not rewritten", async () => {
  const written: number[] = [];
  let release: (() => void) | undefined;
  const w = new LeaseWriter({
    path: "/x",
    logger: createLogger({ level: "error", sink: () => {} }),
    write: async (_p, text) => {
      if (!release) await new Promise<void>((r) => (release = r));
      written.push((JSON.parse(text) as Lease).heartbeatMs);
    },
  });
  const first = w.write(lease(1));
  // While the first write is held, two more are asked for: only the newest follows it.
  void w.write(lease(2));
  const last = w.write(lease(3));
  await Bun.sleep(0);
  release?.();
  await Promise.all([first, last]);
  expect(written).toEqual([1, 3]);
  await w.write(lease(3));
  expect(written).toEqual([1, 3]);
});

test("a failed write is logged and never rejects; the next one is tried", async () => {
  const lines: string[] = [];
  let fail = true;
  const written: number[] = [];
  const w = new LeaseWriter({
    path: "/x",
    logger: createLogger({ level: "error", sink: (l) => void lines.push(l) }),
    write: async (_p, text) => {
      if (fail) throw new Error("ENOSPC");
      written.push((JSON.parse(text) as Lease).heartbeatMs);
    },
  });
  await w.write(lease(1));
  expect(lines.some((l) => l.includes("serving lease not written") && l.includes("ENOSPC"))).toBe(true);
  fail = false;
  await w.write(lease(1));
  expect(written).toEqual([1]);
});
