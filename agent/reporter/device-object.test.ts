// What the reporter writes on NVMeDevice objects: the spec patch (never identity), and the
// status transitions for present and absent drives, claim identity always kept.
import { expect, test } from "bun:test";
import * as v from "valibot";
import { exampleNVMeDevice } from "../../api/examples.ts";
import { type NVMeDevice, NVMeDeviceSchema, type NVMeDeviceStatus } from "../../api/nvme-device.ts";
import type { DiscoveredDevice } from "../discovery/inventory.ts";
import { identityMatches, newDevice, nextDeviceStatus, PRESENT, specPatch } from "./device-object.ts";

const GiB = 1024 ** 3;
const now = new Date("2026-03-01T12:00:00Z");
const earlier = "2026-02-01T10:00:00Z";
const claim = { namespace: "distort-system", name: "drive-1", uid: "6d1f7c1e-0000-4000-8000-000000000002" };

const found = (extra: Partial<DiscoveredDevice> = {}): DiscoveredDevice => ({
  serial: "S4EWNX0R123456",
  pciAddress: "0000:3b:00.0",
  model: "SAMSUNG MZQL23T8HCLS",
  numaNode: 0,
  namespace1Bytes: 3_840_755_982_336,
  allocatableBytes: 3_802_346_291_200,
  activeBackend: "kernel",
  kernel: { controller: "nvme0", blockDevice: "nvme0n1" },
  ...extra,
});

const device = (status: NVMeDeviceStatus | undefined): NVMeDevice => {
  const d = exampleNVMeDevice();
  return { ...d, spec: { ...d.spec, allocatableBytes: 3_802_346_291_200 }, status };
};

test("a new device carries the discovered spec and parses", () => {
  const d = newDevice("node-a-0123456789abcdef", "node-a", found());
  expect(v.safeParse(NVMeDeviceSchema, d).success).toBe(true);
  expect(d.spec).toEqual({
    nodeName: "node-a",
    pciAddress: "0000:3b:00.0",
    serial: "S4EWNX0R123456",
    model: "SAMSUNG MZQL23T8HCLS",
    allocatableBytes: 3_802_346_291_200,
    numaNode: 0,
  });
  expect(d.status).toBeUndefined();
});

test.each<[string, Partial<DiscoveredDevice>, object | undefined]>([
  ["unchanged", {}, undefined],
  [
    "capacity grew after a namespace resize",
    { allocatableBytes: 3_900_000_000_000 },
    { allocatableBytes: 3_900_000_000_000 },
  ],
  ["model and NUMA node", { model: "NEW", numaNode: 1 }, { model: "NEW", numaNode: 1 }],
  ["drive moved to another slot", { pciAddress: "0000:5e:00.0" }, { pciAddress: "0000:5e:00.0" }],
  // Identity never goes into a patch, even if discovery disagreed.
  ["serial difference is not patched", { serial: "OTHER" }, undefined],
])("specPatch: %s", (_name, change, want) => {
  expect(specPatch(device(undefined).spec, found(change))).toEqual(want as never);
});

test.each([
  ["same node and serial", "node-a", "S4EWNX0R123456", true],
  ["other node", "node-b", "S4EWNX0R123456", false],
  ["other serial", "node-a", "S4EWNX0R123457", false],
  ["serial differing in padding", "node-a", "S4EWNX0R123456 ", false],
])("identityMatches: %s", (_name, node, serial, want) => {
  expect(identityMatches(device(undefined), node, serial)).toBe(want);
});

const present = (status: string, reason: string) => ({ type: PRESENT, status, reason });

interface Row {
  name: string;
  before: NVMeDeviceStatus | undefined;
  obs: Parameters<typeof nextDeviceStatus>[1];
  phase: string;
  claimRef: typeof claim | undefined;
  condition: ReturnType<typeof present>;
  transitioned: boolean;
}

const base = { reservations: [], conditions: [] };
const rows: Row[] = [
  {
    name: "new device seen: Available",
    before: undefined,
    obs: { kind: "present", device: found() },
    phase: "Available",
    claimRef: undefined,
    condition: present("True", "BoundToKernel"),
    transitioned: true,
  },
  {
    name: "claimed device seen: stays Claimed",
    before: { ...base, phase: "Claimed", claimRef: claim, freeBytes: GiB },
    obs: {
      kind: "present",
      device: found({ activeBackend: "spdk", spdk: { controller: "Nvme0", bdev: "Nvme0n1" } }),
    },
    phase: "Claimed",
    claimRef: claim,
    condition: present("True", "BoundToSpdk"),
    transitioned: true,
  },
  {
    name: "claimed device missing from a complete scan: Unavailable, claim kept",
    before: { ...base, phase: "Claimed", claimRef: claim, freeBytes: GiB },
    obs: { kind: "absent" },
    phase: "Unavailable",
    claimRef: claim,
    condition: present("False", "NotFound"),
    transitioned: true,
  },
  {
    name: "unclaimed device left out because it is now mounted",
    before: { ...base, phase: "Available" },
    obs: { kind: "absent", why: "Mounted" },
    phase: "Unavailable",
    claimRef: undefined,
    condition: present("False", "Mounted"),
    transitioned: true,
  },
  {
    name: "unavailable claimed device returns: Claimed again",
    before: {
      ...base,
      phase: "Unavailable",
      claimRef: claim,
      conditions: [
        { type: PRESENT, status: "False", reason: "NotFound", message: "", lastTransitionTime: earlier },
      ],
    },
    obs: { kind: "present", device: found() },
    phase: "Claimed",
    claimRef: claim,
    condition: present("True", "BoundToKernel"),
    transitioned: true,
  },
  {
    name: "unavailable unclaimed device returns: Available",
    before: { ...base, phase: "Unavailable" },
    obs: { kind: "present", device: found() },
    phase: "Available",
    claimRef: undefined,
    condition: present("True", "BoundToKernel"),
    transitioned: true,
  },
  {
    name: "still missing: unchanged transition time",
    before: {
      ...base,
      phase: "Unavailable",
      conditions: [
        {
          type: PRESENT,
          status: "False",
          reason: "NotFound",
          message: "not found by a complete scan of kernel and SPDK controllers",
          observedGeneration: 1,
          lastTransitionTime: earlier,
        },
      ],
    },
    obs: { kind: "absent" },
    phase: "Unavailable",
    claimRef: undefined,
    condition: present("False", "NotFound"),
    transitioned: false,
  },
];

test.each(rows)("nextDeviceStatus: $name", (row) => {
  const before = device(row.before);
  const after = nextDeviceStatus(before, row.obs, now);
  expect(after.phase).toBe(row.phase as never);
  expect(after.claimRef).toEqual(row.claimRef as never);
  const c = after.conditions.find((x) => x.type === PRESENT);
  expect(c).toMatchObject({ ...row.condition, observedGeneration: 1 });
  expect(c?.lastTransitionTime).toBe(row.transitioned ? "2026-03-01T12:00:00Z" : earlier);
  // Fields owned by the manager survive every transition.
  expect(after.freeBytes).toBe(row.before?.freeBytes as never);
  expect(v.safeParse(NVMeDeviceSchema, { ...before, status: after }).success).toBe(true);
});

test("manager-owned fields and foreign conditions are kept", () => {
  const before = device({
    phase: "Claimed",
    claimRef: claim,
    freeBytes: 5 * GiB,
    activeBackend: "spdk",
    reservations: [],
    conditions: [
      { type: "Bound", status: "True", reason: "ClaimBound", message: "", lastTransitionTime: earlier },
    ],
    observedGeneration: 1,
  });
  const after = nextDeviceStatus(before, { kind: "absent" }, now);
  expect(after).toMatchObject({
    claimRef: claim,
    freeBytes: 5 * GiB,
    activeBackend: "spdk",
    observedGeneration: 1,
  });
  expect(after.conditions.map((c) => c.type)).toEqual(["Bound", PRESENT]);
});

test("an unchanged present device computes the status it already has", () => {
  const once = nextDeviceStatus(device(undefined), { kind: "present", device: found() }, now);
  const twice = nextDeviceStatus(
    device(once),
    { kind: "present", device: found() },
    new Date("2026-03-02T00:00:00Z"),
  );
  expect(twice).toEqual(once);
});

test("a node serving one backend locks an unlocked present device to it, and never moves a lock", () => {
  const fresh = nextDeviceStatus(device(undefined), { kind: "present", device: found() }, now, "kernel");
  expect(fresh.activeBackend).toBe("kernel");
  const unlocked = nextDeviceStatus(device(undefined), { kind: "present", device: found() }, now);
  expect(unlocked.activeBackend).toBeUndefined();
  const locked = nextDeviceStatus(
    device({ ...fresh, activeBackend: "spdk" }),
    { kind: "present", device: found() },
    now,
    "kernel",
  );
  expect(locked.activeBackend).toBe("spdk");
  const gone = nextDeviceStatus(device(fresh), { kind: "absent" }, now);
  expect(gone.activeBackend).toBe("kernel");
});
