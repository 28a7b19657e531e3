// Table tests of the leftover ledger entries: marked before a partition on a lost drive lets go,
// cleaned only from a drive that is back on this node, dropped only when they are leftovers.
import { describe, expect, test } from "bun:test";
import { exampleNVMeDevice } from "../../api/examples.ts";
import type { NVMeDevice } from "../../api/index.ts";
import { dropLeftover, markLeftover } from "../../lib/device-ledger.ts";
import { leftoversToClean } from "./leftovers.ts";

const UID = "0f8fad5b-d9cb-469f-a165-70867728950e";
const LEFT = { since: "2026-02-01T10:15:00Z", reason: "DeviceUnavailable" };
const present = (status: "True" | "False") => ({
  type: "Present",
  status,
  reason: status === "True" ? "BoundToSpdk" : "NotFound",
  message: "",
  lastTransitionTime: "2026-02-01T10:00:00Z",
});
function dev(mut: (d: NVMeDevice) => void = () => {}): NVMeDevice {
  const d = exampleNVMeDevice();
  d.status!.conditions = [present("True")];
  mut(d);
  return d;
}
const withLeftover = (d: NVMeDevice) => {
  d.status!.reservations = [
    { ...d.status!.reservations![0]!, leftover: LEFT },
    { uid: "live", namespace: "distort-system", name: "other", bytes: 1 },
  ];
};

describe("markLeftover", () => {
  test("marks the partition's entry and keeps every other field and entry", () => {
    const d = dev((x) => x.status!.reservations!.push({ uid: "b", namespace: "n", name: "b", bytes: 4 }));
    const s = markLeftover(d, UID, LEFT);
    expect(s?.reservations).toEqual([
      { ...d.status!.reservations![0]!, leftover: LEFT },
      d.status!.reservations![1]!,
    ]);
    expect(s?.claimRef).toEqual(d.status!.claimRef);
  });
  test.each([
    ["no entry for the UID: no room to hold", dev(), "someone"],
    ["already marked: the first time stands", dev(withLeftover), UID],
    ["no status at all", dev((x) => delete x.status), UID],
  ])("%s -> no write", (_n, d, uid) => {
    expect(markLeftover(d, uid, { since: "2027-01-01T00:00:00Z", reason: "NodeLost" })).toBeUndefined();
  });
});

describe("dropLeftover", () => {
  test("drops only the leftover entry of that UID", () => {
    const s = dropLeftover(dev(withLeftover), UID);
    expect(s?.reservations?.map((r) => r.uid)).toEqual(["live"]);
  });
  test("an entry that is no leftover (a live partition's) is never dropped", () => {
    expect(dropLeftover(dev(withLeftover), "live")).toBeUndefined();
    expect(dropLeftover(dev(), UID)).toBeUndefined();
  });
});

describe("leftoversToClean", () => {
  const table: [string, NVMeDevice | undefined, string, boolean][] = [
    ["returned drive on this node", dev(withLeftover), "node-a", true],
    ["another node's drive", dev(withLeftover), "node-b", false],
    [
      "still Unavailable",
      dev((d) => {
        withLeftover(d);
        d.status!.phase = "Unavailable";
        d.status!.conditions = [present("False")];
      }),
      "node-a",
      false,
    ],
    [
      "phase back but Present not True yet",
      dev((d) => {
        withLeftover(d);
        d.status!.conditions = [present("False")];
      }),
      "node-a",
      false,
    ],
    ["no leftovers", dev(), "node-a", false],
    ["no device", undefined, "node-a", false],
  ];
  test.each(table)("%s -> clean: %p", (_n, d, node, clean) => {
    const plan = leftoversToClean(d, node);
    expect(plan !== undefined).toBe(clean);
    if (plan) {
      expect(plan.entries.map((e) => e.uid)).toEqual([UID]);
      expect(plan.backend).toBe("spdk");
    }
  });
  test("a drive never locked to a backend has no volume: entries only go", () => {
    const plan = leftoversToClean(
      dev((d) => {
        withLeftover(d);
        delete d.status!.activeBackend;
      }),
      "node-a",
    );
    expect(plan?.backend).toBeUndefined();
    expect(plan?.entries).toHaveLength(1);
  });
});
