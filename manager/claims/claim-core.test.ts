// Claim binding, table-driven: binding by exact serial (and node), never stealing, holding
// deletion while partitions remain, reclaiming devices of vanished claims, and the device-side
// bind/release decisions that guard against a replacement claim being released by an old one.
import { describe, expect, test } from "bun:test";
import type { NVMeDevice, NVMeDeviceClaim, NVMePartition } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { claim, cond, device, partition, refOf } from "../testdata/fixtures.ts";
import { CLAIM_FINALIZER } from "../vocabulary.ts";
import {
  type BoundReason,
  bindDeviceStatus,
  type ClaimAction,
  decideClaim,
  decideMissingClaim,
  releaseDeviceStatus,
} from "./claim-core.ts";

function view(devices: NVMeDevice[], partitions: NVMePartition[] = []): Inventory {
  const inv = new Inventory();
  for (const d of devices) inv.setDevice(d);
  for (const p of partitions) inv.setPartition(p);
  return inv;
}

const F = [CLAIM_FINALIZER];
const c1 = claim("admin", "c1", { serial: "S1", finalizers: F });
const ref1 = refOf(c1);
const other = refOf(claim("admin", "other", { uid: "uid-other" }));
const types = (a: ClaimAction[]): string[] => a.map((x) => x.type);

describe("decideClaim (live claim)", () => {
  const cases: {
    name: string;
    claim: NVMeDeviceClaim;
    devices: NVMeDevice[];
    actions: string[];
    phase: string;
    reason: BoundReason;
    device?: string;
    message?: RegExp;
  }[] = [
    {
      name: "binds the one device with the serial",
      claim: c1,
      devices: [device("d1", { serial: "S1", phase: "Available" }), device("d2", { serial: "S2" })],
      actions: ["bind", "event"],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d1",
    },
    {
      name: "binds a device that has no status yet",
      claim: c1,
      devices: [device("d1", { serial: "S1" })],
      actions: ["bind", "event"],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d1",
    },
    {
      name: "adds its finalizer first",
      claim: claim("admin", "c1", { serial: "S1" }),
      devices: [device("d1", { serial: "S1" })],
      actions: ["addFinalizer", "bind", "event"],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d1",
    },
    {
      name: "keeps an existing binding without writing the device",
      claim: claim("admin", "c1", {
        serial: "S1",
        finalizers: F,
        boundTo: "d1",
        conditions: [
          { ...cond("Bound", "True", "DeviceBound"), message: "bound to device d1 on node node-a" },
        ],
      }),
      devices: [device("d1", { serial: "S1", claim: ref1 })],
      actions: [],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d1",
    },
    {
      name: "respects spec.nodeName",
      claim: claim("admin", "c1", { serial: "S1", nodeName: "node-b", finalizers: F }),
      devices: [
        device("d1", { serial: "S1", node: "node-a" }),
        device("d2", { serial: "S1", node: "node-b" }),
      ],
      actions: ["bind", "event"],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d2",
    },
    {
      name: "refuses an ambiguous serial",
      claim: c1,
      devices: [
        device("d1", { serial: "S1", node: "node-a" }),
        device("d2", { serial: "S1", node: "node-b" }),
      ],
      actions: ["event"],
      phase: "Pending",
      reason: "AmbiguousSerial",
      message: /nodes node-a, node-b; set spec.nodeName/,
    },
    {
      name: "never steals a device claimed by another claim",
      claim: c1,
      devices: [device("d1", { serial: "S1", claim: other })],
      actions: ["event"],
      phase: "Pending",
      reason: "DeviceClaimedByOther",
      message: /already claimed by admin\/other/,
    },
    {
      name: "reclaims a device named by an earlier claim of the same name",
      claim: c1,
      devices: [device("d1", { serial: "S1", claim: { ...ref1, uid: "uid-old" } })],
      actions: ["releaseOrphan", "event"],
      phase: "Pending",
      reason: "DeviceClaimedByOther",
      message: /earlier claim admin\/c1 \(uid uid-old\)/,
    },
    {
      name: "waits for a device that does not exist",
      claim: c1,
      devices: [device("d2", { serial: "S2" })],
      actions: ["event"],
      phase: "Pending",
      reason: "DeviceNotFound",
      message: /no NVMeDevice with serial S1$/,
    },
    {
      name: "is Lost when its bound device disappeared",
      claim: claim("admin", "c1", { serial: "S1", finalizers: F, boundTo: "d1" }),
      devices: [],
      actions: ["event"],
      phase: "Lost",
      reason: "DeviceLost",
      device: "d1",
    },
    {
      name: "is Lost while its device is Unavailable",
      claim: c1,
      devices: [device("d1", { serial: "S1", claim: ref1, phase: "Unavailable" })],
      actions: ["event"],
      phase: "Lost",
      reason: "DeviceUnavailable",
      device: "d1",
    },
    {
      name: "does not bind an Unavailable device",
      claim: c1,
      devices: [device("d1", { serial: "S1", phase: "Unavailable" })],
      actions: ["event"],
      phase: "Pending",
      reason: "DeviceUnavailable",
    },
    {
      name: "reports a binding that spec.nodeName no longer selects",
      claim: claim("admin", "c1", { serial: "S1", nodeName: "node-b", finalizers: F }),
      devices: [device("d1", { serial: "S1", node: "node-a", claim: ref1 })],
      actions: ["event"],
      phase: "Bound",
      reason: "NodeMismatch",
      device: "d1",
    },
    {
      name: "repairs a device that names it but is not marked Claimed",
      claim: c1,
      devices: [device("d1", { serial: "S1", claim: ref1, phase: "Available" })],
      actions: ["bind", "event"],
      phase: "Bound",
      reason: "DeviceBound",
      device: "d1",
    },
  ];
  test.each(cases)("$name", (c) => {
    const out = decideClaim(c.claim, view(c.devices));
    expect(types(out.actions)).toEqual(c.actions);
    expect(out.status?.set?.phase).toBe(c.phase as never);
    expect(out.status?.set?.deviceName).toBe(c.device);
    expect(out.status?.set?.observedGeneration).toBe(c.claim.metadata.generation);
    const bound = out.status?.conditions?.[0];
    expect(bound).toMatchObject({
      type: "Bound",
      status: c.reason === "DeviceBound" ? "True" : "False",
      reason: c.reason,
      observedGeneration: c.claim.metadata.generation,
    });
    if (c.message) expect(bound?.message).toMatch(c.message);
    const bind = out.actions.find((a) => a.type === "bind");
    if (bind?.type === "bind") expect(bind.device).toBe(c.device as string);
  });

  test("the Bound condition follows the generation", () => {
    const c = claim("admin", "c1", { serial: "S1", finalizers: F, generation: 7 });
    const out = decideClaim(c, view([device("d1", { serial: "S1" })]));
    expect(out.status?.conditions?.[0]?.observedGeneration).toBe(7);
    expect(out.status?.set?.observedGeneration).toBe(7);
  });
});

describe("decideClaim (deleting claim)", () => {
  const deleting = claim("admin", "c1", { serial: "S1", finalizers: F, deleting: true, boundTo: "d1" });
  test("releases its device and drops the finalizer when nothing is placed", () => {
    const out = decideClaim(deleting, view([device("d1", { serial: "S1", claim: ref1 })]));
    expect(out.actions).toEqual([
      { type: "release", device: "d1", uid: ref1.uid },
      { type: "event", eventType: "Normal", reason: "Released", note: "device d1 (serial S1) released" },
      { type: "removeFinalizer" },
    ]);
    expect(out.status).toBeUndefined();
  });

  test("never releases a device that names a replacement claim", () => {
    const out = decideClaim(
      deleting,
      view([device("d1", { serial: "S1", claim: { ...ref1, uid: "uid-new" } })]),
    );
    expect(out.actions).toEqual([{ type: "removeFinalizer" }]);
  });

  test("is held while placed partitions remain, naming them", () => {
    const out = decideClaim(
      deleting,
      view(
        [device("d1", { serial: "S1", node: "node-a", claim: ref1 })],
        [
          partition("apps", "p1", { node: "node-a", serial: "S1" }),
          partition("apps", "p2", { node: "node-a", serial: "S1", deleting: true }),
        ],
      ),
    );
    expect(types(out.actions)).toEqual(["event"]);
    expect(out.status?.conditions?.[0]).toMatchObject({
      type: "Released",
      status: "False",
      reason: "PartitionsRemain",
    });
    expect(out.status?.conditions?.[0]?.message).toBe(
      "device d1 still holds 2 partition(s): apps/p1, apps/p2; the device is released once they are deleted",
    );
  });

  test("is held by ledger entries of partitions not placed yet", () => {
    const d = device("d1", {
      serial: "S1",
      claim: ref1,
      reservations: [{ uid: "u", namespace: "apps", name: "p9", bytes: 4 }],
    });
    const out = decideClaim(deleting, view([d]));
    expect(out.status?.conditions?.[0]?.message).toMatch(/apps\/p9/);
    expect(types(out.actions)).not.toContain("release");
  });

  test("does nothing once its finalizer is gone", () => {
    const c = claim("admin", "c1", { serial: "S1", deleting: true });
    expect(decideClaim(c, view([device("d1", { serial: "S1", claim: ref1 })]))).toEqual({ actions: [] });
  });
});

describe("decideMissingClaim", () => {
  test("reclaims every device still naming the vanished claim", () => {
    const out = decideMissingClaim(
      "admin/c1",
      view([device("d1", { claim: ref1 }), device("d2", { claim: other })]),
    );
    expect(out.actions).toEqual([
      { type: "releaseOrphan", device: "d1", claimKey: "admin/c1", uid: ref1.uid },
    ]);
  });
});

describe("bindDeviceStatus / releaseDeviceStatus", () => {
  test("bind records namespace, name and UID", () => {
    const r = bindDeviceStatus(device("d1", { phase: "Available" }), c1);
    expect(r).toMatchObject({ ok: true, status: { phase: "Claimed", claimRef: ref1 } });
  });
  test("bind is idempotent", () => {
    const r = bindDeviceStatus(device("d1", { claim: ref1 }), c1);
    expect(r.ok).toBe(true);
  });
  test("bind refuses a device another UID owns", () => {
    const r = bindDeviceStatus(device("d1", { claim: other }), c1);
    expect(r).toEqual({ ok: false, message: "device d1 is claimed by admin/other (uid uid-other)" });
  });
  test("bind refuses an unowned Unavailable device", () => {
    expect(bindDeviceStatus(device("d1", { phase: "Unavailable" }), c1).ok).toBe(false);
  });
  test("release returns the device to Available and drops claimRef", () => {
    const r = releaseDeviceStatus(device("d1", { claim: ref1, activeBackend: "spdk" }), ref1.uid);
    expect(r.kind).toBe("release");
    if (r.kind !== "release") return;
    expect(r.status.phase).toBe("Available");
    expect(r.status.claimRef).toBeUndefined();
    expect(r.status.activeBackend).toBe("spdk");
  });
  test("release by an old UID leaves a replacement's binding alone", () => {
    expect(releaseDeviceStatus(device("d1", { claim: { ...ref1, uid: "uid-new" } }), ref1.uid)).toEqual({
      kind: "not-owner",
    });
  });
  test("release is refused while the ledger holds partitions", () => {
    const d = device("d1", {
      claim: ref1,
      reservations: [{ uid: "u", namespace: "apps", name: "p", bytes: 4 }],
    });
    expect(releaseDeviceStatus(d, ref1.uid)).toEqual({
      kind: "held",
      message: "device d1 holds 1 partition(s): apps/p",
    });
  });
  test("release keeps an Unavailable device Unavailable", () => {
    const r = releaseDeviceStatus(device("d1", { claim: ref1, phase: "Unavailable" }), ref1.uid);
    expect(r.kind === "release" && r.status.phase).toBe("Unavailable");
  });
});
