// The advertise gate: exact serial, normalized PCI address, namespace 1 with positive capacity;
// and duplicate serials within one source rejected.
import { expect, test } from "bun:test";
import type { InventoryProblem, SourceController } from "./inventory.ts";
import {
  type ControllerReport,
  isProblem,
  rejectDuplicateSerials,
  trimIdentifyString,
  validateController,
} from "./validate-controller.ts";

const GiB = 1024 ** 3;
const good: ControllerReport = {
  source: "kernel",
  controller: "nvme0",
  serial: "S4EWNX0R123456      ",
  pciAddress: "0000:3B:00.0",
  model: "SAMSUNG MZQL23T8HCLS                    ",
  numaNode: 1,
  namespace1Bytes: 100 * GiB,
  blockDevice: "nvme0n1",
};

test("a good controller is trimmed, normalized and sized", () => {
  const r = validateController(good);
  expect(isProblem(r)).toBe(false);
  expect(r).toEqual({
    source: "kernel",
    controller: "nvme0",
    serial: "S4EWNX0R123456",
    pciAddress: "0000:3b:00.0",
    model: "SAMSUNG MZQL23T8HCLS",
    numaNode: 1,
    namespace1Bytes: 100 * GiB,
    allocatableBytes: 101_376 * 1024 ** 2,
    blockDevice: "nvme0n1",
  } satisfies SourceController);
});

test.each<[string, Partial<ControllerReport>, string]>([
  ["no controller name", { controller: " " }, "ControllerNameMissing"],
  ["serial not reported", { serial: undefined }, "SerialMissing"],
  ["serial all padding", { serial: "                    " }, "SerialMissing"],
  ["serial with a control character", { serial: "S4EW\tNX0R" }, "SerialInvalid"],
  ["serial lost in decoding", { serial: "S4EW\ufffdNX0R" }, "SerialInvalid"],
  ["serial too long", { serial: "S".repeat(257) }, "SerialInvalid"],
  ["PCI address missing", { pciAddress: undefined }, "PciAddressInvalid"],
  [
    "PCI address of a fabrics controller",
    { pciAddress: "traddr=10.0.0.1,trsvcid=4420" },
    "PciAddressInvalid",
  ],
  ["no namespace 1", { namespace1Bytes: undefined }, "Namespace1Missing"],
  ["zero-sized namespace 1", { namespace1Bytes: 0 }, "CapacityInvalid"],
  ["namespace 1 too small for one unit", { namespace1Bytes: 4 * 1024 ** 2 }, "CapacityInvalid"],
  ["size that is not a number", { namespace1Bytes: Number.NaN }, "CapacityInvalid"],
])("rejects: %s", (_name, change, reason) => {
  const r = validateController({ ...good, ...change });
  expect(isProblem(r)).toBe(true);
  expect((r as InventoryProblem).reason).toBe(reason);
  expect((r as InventoryProblem).controller).toBe(change.controller ?? "nvme0");
});

test.each<[string, Partial<ControllerReport>, Partial<SourceController>]>([
  ["inner spaces of a serial are kept", { serial: "  AB  CD  " }, { serial: "AB  CD" }],
  ["a unicode serial is exact text", { serial: "シリアル1" }, { serial: "シリアル1" }],
  ["missing model is empty", { model: undefined }, { model: "" }],
  ["control characters in the model are masked", { model: "X\u0001Y" }, { model: "X?Y" }],
  ["unknown NUMA node", { numaNode: undefined }, { numaNode: -1 }],
  ["NUMA node out of range", { numaNode: 5000 }, { numaNode: -1 }],
])("accepts: %s", (_name, change, want) => {
  const r = validateController({ ...good, ...change });
  expect(isProblem(r)).toBe(false);
  expect(r).toMatchObject(want);
});

test.each([
  ["S4EW      ", "S4EW"],
  ["  S4EW", "S4EW"],
  ["S4 EW\n", "S4 EW"],
  ["", ""],
])("trimIdentifyString(%p) = %p", (raw, want) => {
  expect(trimIdentifyString(raw)).toBe(want);
});

test("duplicate serials within a source reject every copy", () => {
  const a = validateController(good) as SourceController;
  const b = { ...a, controller: "nvme1", pciAddress: "0000:5e:00.0" };
  const c = { ...a, controller: "nvme2", serial: "OTHER", pciAddress: "0000:af:00.0" };
  const r = rejectDuplicateSerials([a, b, c]);
  expect(r.controllers.map((x) => x.controller)).toEqual(["nvme2"]);
  expect(r.problems.map((p) => [p.controller, p.reason])).toEqual([
    ["nvme0", "DuplicateSerial"],
    ["nvme1", "DuplicateSerial"],
  ]);
});
