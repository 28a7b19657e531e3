// PlacedDigest: placements on one device within the window become one event naming them; other
// devices get their own; flush() emits what is pending.
import { expect, test } from "bun:test";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { EventPort } from "../events.ts";
import { device, GiB } from "../testdata/fixtures.ts";
import { PlacedDigest } from "./placed-digest.ts";

function setup() {
  const seen: string[] = [];
  const port = new EventPort(
    {
      record: async (o, type, reason, _action, note) => {
        seen.push(`${o.metadata.name} ${type} ${reason}: ${note}`);
      },
    },
    silentLogger,
  );
  const clock = new ManualClock(0);
  return { seen, port, clock, digest: new PlacedDigest(port, clock, 1000) };
}

test("one event per device per window, naming every partition placed in it", async () => {
  const { seen, port, clock, digest } = setup();
  const d1 = device("d1", { node: "node-a", serial: "S1" });
  const d2 = device("d2", { node: "node-b", serial: "S2" });
  digest.add(d1, "apps/p1", GiB);
  clock.advance(500);
  digest.add(d1, "apps/p2", 2 * GiB);
  digest.add(d2, "apps/p3", GiB);
  clock.advance(499);
  await port.drain();
  expect(seen).toEqual([]);
  clock.advance(1);
  await port.drain();
  expect(seen).toEqual([
    "d1 Normal Placed: placed 2 partitions on node node-a, serial S1; 3 GiB reserved: apps/p1, apps/p2",
  ]);
  clock.advance(500);
  await port.drain();
  expect(seen[1]).toBe(
    "d2 Normal Placed: placed 1 partition on node node-b, serial S2; 1 GiB reserved: apps/p3",
  );
  expect(clock.pendingTimers).toBe(0);
});

test("long lists are cut after 20 names; flush emits at once and cancels the timer", async () => {
  const { seen, port, clock, digest } = setup();
  const d1 = device("d1", { node: "node-a", serial: "S1" });
  for (let i = 0; i < 25; i++) digest.add(d1, `apps/p${i}`, GiB);
  digest.flush();
  await port.drain();
  expect(seen).toHaveLength(1);
  expect(seen[0]).toContain("placed 25 partitions");
  expect(seen[0]).toEndWith("apps/p19 and 5 more");
  expect(clock.pendingTimers).toBe(0);
  digest.flush();
  await port.drain();
  expect(seen).toHaveLength(1);
});
