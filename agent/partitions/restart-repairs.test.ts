// RestartRepairs: the replay after a known target restart yields exactly one summary; repairs it
// explains are expected, any other repair (drift, a second repair of one export) is not.
import { expect, test } from "bun:test";
import { ManualClock } from "../../lib/clock.ts";
import { RestartRepairs, type RestartSummary } from "./restart-repairs.ts";

function tracker(deadlineMs?: number) {
  const clock = new ManualClock();
  const summaries: RestartSummary[] = [];
  const r = new RestartRepairs({ clock, deadlineMs, onSummary: (s) => summaries.push(s) });
  return { clock, summaries, r };
}

const keys = (n: number) => Array.from({ length: n }, (_, i) => `ns/p${i}`);

test("one summary once every partition exported at the restart has been verified", () => {
  const { clock, summaries, r } = tracker();
  r.begin("spdk", keys(1000));
  for (const [i, k] of keys(1000).entries()) {
    clock.advance(3);
    expect(r.verified(k, "spdk", i !== 7)).toBe(true);
    if (i < 999) expect(summaries).toEqual([]);
  }
  expect(summaries).toEqual([
    { backend: "spdk", exports: 1000, verified: 1000, repaired: 999, unverified: 0, seconds: 3 },
  ]);
  expect(clock.pendingTimers).toBe(0);
});

test("repairs the restart does not explain are drift: other partitions, other backends, second repairs", () => {
  const { summaries, r } = tracker();
  expect(r.verified("ns/p0", "spdk", true)).toBe(false); // no restart known
  r.begin("spdk", keys(2));
  expect(r.verified("ns/new", "spdk", true)).toBe(false); // not exported when it restarted
  expect(r.verified("ns/p0", "kernel", true)).toBe(false); // another backend
  expect(r.verified("ns/p0", "spdk", true)).toBe(true);
  expect(r.verified("ns/p0", "spdk", true)).toBe(false); // already replayed: drift since
  expect(summaries).toEqual([]);
  r.dropped("ns/p1"); // deleted meanwhile: not awaited
  expect(summaries).toMatchObject([{ exports: 2, verified: 1, repaired: 1, unverified: 0 }]);
});

test("a replay that does not finish is summarized at the deadline with what is left", () => {
  const { clock, summaries, r } = tracker(60_000);
  r.begin("spdk", keys(3));
  r.verified("ns/p0", "spdk", true);
  clock.advance(60_000);
  expect(summaries).toEqual([
    { backend: "spdk", exports: 3, verified: 1, repaired: 1, unverified: 2, seconds: 60 },
  ]);
  expect(r.verified("ns/p1", "spdk", true)).toBe(false);
});

test("a second restart during a replay summarizes the first; nothing exported means nothing to report", () => {
  const { summaries, r } = tracker();
  r.begin("spdk", []);
  r.begin("spdk", keys(2));
  r.verified("ns/p0", "spdk", true);
  r.begin("spdk", keys(2));
  expect(summaries).toMatchObject([{ exports: 2, verified: 1, unverified: 1 }]);
  expect(r.verified("ns/p0", "spdk", true)).toBe(true);
  r.close();
  expect(summaries).toHaveLength(1);
  expect(r.verified("ns/p1", "spdk", true)).toBe(false);
});
