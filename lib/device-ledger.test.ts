// The expansion step of the device ledger: an entry grows only when the device has room for it
// next to every other holder, and two growths decided on one device version cannot both fit.
import { describe, expect, test } from "bun:test";
import { exampleNVMeDevice } from "../api/examples.ts";
import type { NVMeDevice } from "../api/index.ts";
import { growVerdict, type PartitionUse } from "./device-ledger.ts";

const GiB = 1024 ** 3;
const use = (uid: string, bytes: number): PartitionUse => ({
  uid,
  namespace: "distort-system",
  name: uid,
  bytes,
  terminating: false,
});
function device(allocatable: number, entries: [string, number][]): NVMeDevice {
  const d = exampleNVMeDevice();
  d.spec.allocatableBytes = allocatable;
  d.status!.reservations = entries.map(([uid, bytes]) => ({
    uid,
    namespace: "distort-system",
    name: uid,
    bytes,
  }));
  return d;
}

describe("growVerdict", () => {
  test("raises the entry when the rest leaves room, and records the new free bytes", () => {
    const v = growVerdict(
      device(10 * GiB, [
        ["a", 4 * GiB],
        ["b", 4 * GiB],
      ]),
      [],
      use("a", 6 * GiB),
    );
    if (v.kind !== "write") throw new Error(v.kind);
    expect(v.status.reservations).toEqual([
      { uid: "a", namespace: "distort-system", name: "a", bytes: 6 * GiB },
      { uid: "b", namespace: "distort-system", name: "b", bytes: 4 * GiB },
    ]);
    expect(v.status.freeBytes).toBe(0);
  });

  test("two growths that fit only one at a time: the second, decided on the first's ledger, is refused", () => {
    const d = device(10 * GiB, [
      ["a", 4 * GiB],
      ["b", 4 * GiB],
    ]);
    const first = growVerdict(d, [], use("a", 5 * GiB));
    if (first.kind !== "write") throw new Error(first.kind);
    const second = growVerdict({ ...d, status: first.status }, [], use("b", 6 * GiB));
    expect(second.kind).toBe("reject");
    // Decided on the old version, the second would fit: only the guarded write keeps them apart.
    expect(growVerdict(d, [], use("b", 6 * GiB)).kind).toBe("write");
  });

  test("a placed partition without an entry, and a grown placed size, count against the room", () => {
    const d = device(10 * GiB, [["a", 4 * GiB]]);
    expect(growVerdict(d, [use("c", 5 * GiB)], use("a", 6 * GiB)).kind).toBe("reject");
    expect(growVerdict(d, [use("c", 5 * GiB)], use("a", 5 * GiB)).kind).toBe("write");
    const v = growVerdict(d, [use("a", 4 * GiB)], use("a", 10 * GiB));
    expect(v.kind).toBe("write");
  });

  test("an entry already that large is held; a missing entry is added; no status is refused", () => {
    expect(growVerdict(device(10 * GiB, [["a", 6 * GiB]]), [], use("a", 5 * GiB)).kind).toBe("held");
    const added = growVerdict(device(10 * GiB, []), [], use("n", GiB));
    expect(added.kind === "write" && added.status.reservations).toEqual([
      { uid: "n", namespace: "distort-system", name: "n", bytes: GiB },
    ]);
    const bare = device(10 * GiB, []);
    delete bare.status;
    expect(growVerdict(bare, [], use("n", GiB)).kind).toBe("reject");
  });
});
