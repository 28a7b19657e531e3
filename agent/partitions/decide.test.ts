// Table tests of the partition reconciler's decisions.
import { describe, expect, test } from "bun:test";
import { exampleNVMeDevice, exampleNVMePartition } from "../../api/examples.ts";
import type { NVMeDevice, NVMePartition } from "../../api/index.ts";
import { type Decision, decide, type Observed, PARTITION_FINALIZER, resolveVolumeManager } from "./decide.ts";
import { externalIdFor, nqnFor } from "./identity.ts";

function part(mut: (p: NVMePartition) => void = () => {}): NVMePartition {
  const p = exampleNVMePartition();
  p.metadata.finalizers = [PARTITION_FINALIZER];
  delete p.status;
  mut(p);
  return p;
}
function dev(mut: (d: NVMeDevice) => void = () => {}): NVMeDevice {
  const d = exampleNVMeDevice();
  mut(d);
  return d;
}
const obs = (o: Partial<Observed>): Observed => ({
  partition: part(),
  nodeName: "node-a",
  device: dev(),
  attachments: [],
  ...o,
});

const cases: [string, Observed, Decision["action"], string?][] = [
  [
    "unplaced",
    obs({
      partition: part((p) => {
        delete p.spec.nodeName;
        delete p.spec.deviceSerial;
      }),
    }),
    "ignore",
  ],
  ["other node", obs({ nodeName: "node-b" }), "ignore"],
  ["no finalizer yet", obs({ partition: part((p) => (p.metadata.finalizers = [])) }), "add-finalizer"],
  ["device not reported", obs({ device: undefined }), "wait", "DeviceNotFound"],
  [
    "device gone from node",
    obs({ device: dev((d) => (d.status!.phase = "Unavailable")) }),
    "wait",
    "DeviceUnavailable",
  ],
  [
    "device of another claim",
    obs({ device: dev((d) => (d.status!.claimRef!.uid = "other")) }),
    "refuse",
    "ClaimMismatch",
  ],
  [
    "device claimed by nobody",
    obs({ device: dev((d) => delete d.status!.claimRef) }),
    "refuse",
    "ClaimMismatch",
  ],
  [
    "kernel drive, spdk partition",
    obs({ device: dev((d) => (d.status!.activeBackend = "kernel")) }),
    "refuse",
    "BackendConflict",
  ],
  [
    "placed without a claim (not by the manager)",
    obs({ partition: part((p) => delete p.spec.claimRef) }),
    "refuse",
    "NotPlacedByManager",
  ],
  [
    "placed on a drive whose ledger has no entry for it",
    obs({ device: dev((d) => (d.status!.reservations = [])) }),
    "refuse",
    "NotReserved",
  ],
  [
    "ledger entry of another partition only",
    obs({ device: dev((d) => (d.status!.reservations![0]!.uid = "someone-else")) }),
    "refuse",
    "NotReserved",
  ],
  [
    "not reserved and no finalizer yet: refused before the finalizer",
    obs({
      partition: part((p) => (p.metadata.finalizers = [])),
      device: dev((d) => (d.status!.reservations = [])),
    }),
    "refuse",
    "NotReserved",
  ],
  [
    "deleting a partition the manager never placed here",
    obs({
      partition: part((p) => {
        p.metadata.deletionTimestamp = "2026-02-01T10:00:00Z";
        p.status = { state: "Exported", externalId: "vol-of-someone-else", conditions: [] };
      }),
      device: dev((d) => (d.status!.reservations = [])),
    }),
    "release",
    "NotReserved",
  ],
  ["drive serial differs", obs({ device: dev((d) => (d.spec.serial = "X")) }), "refuse", "DeviceMismatch"],
  ["ready to provision", obs({}), "provision"],
  [
    "deleting with attachments",
    obs({
      partition: part((p) => (p.metadata.deletionTimestamp = "2026-02-01T10:00:00Z")),
      attachments: ["va-1"],
    }),
    "block-deletion",
    "AttachmentsExist",
  ],
  [
    "deleting",
    obs({ partition: part((p) => (p.metadata.deletionTimestamp = "2026-02-01T10:00:00Z")) }),
    "deprovision",
  ],
  [
    "deleting, device already gone",
    obs({
      partition: part((p) => (p.metadata.deletionTimestamp = "2026-02-01T10:00:00Z")),
      device: undefined,
    }),
    "deprovision",
  ],
  [
    "deleted and cleaned",
    obs({
      partition: part((p) => {
        p.metadata.deletionTimestamp = "2026-02-01T10:00:00Z";
        p.metadata.finalizers = [];
      }),
    }),
    "done",
  ],
];

describe("decide", () => {
  for (const [name, o, action, reason] of cases) {
    test(name, () => {
      const d = decide(o);
      expect(d.action).toBe(action);
      if (reason) expect((d as { why: { reason: string } }).why.reason).toBe(reason);
    });
  }

  test("provision carries identity from the UID, rounded size, resolved plugins and the lock flag", () => {
    const p = part((x) => (x.spec.sizeBytes = 10 * 1024 * 1024 + 1));
    const d = decide(obs({ partition: p, device: dev((x) => delete x.status!.activeBackend) }));
    if (d.action !== "provision") throw new Error(d.action);
    const id = externalIdFor(p.metadata.uid as string);
    expect(d.target).toMatchObject({ backend: "spdk", volumeManager: "spdk-lvol", nqn: nqnFor(id) });
    expect(d.target.volume).toMatchObject({ externalId: id, sizeBytes: 12 * 1024 * 1024 });
    expect(d.lockDevice).toBe(true);
    expect((decide(obs({ partition: p })) as { lockDevice: boolean }).lockDevice).toBe(false);
  });

  test("a recorded externalId wins over the derived one (identity never changes under a live volume)", () => {
    const p = part((x) => (x.status = { state: "Exported", externalId: "vol-recorded", conditions: [] }));
    const d = decide(obs({ partition: p }));
    expect(d.action === "provision" && d.target.nqn).toBe(nqnFor("vol-recorded"));
  });

  test("volume manager mapping", () => {
    expect(resolveVolumeManager("spdk", "partition")).toBe("spdk-lvol");
    expect(resolveVolumeManager("kernel", "partition")).toBe("parted");
    expect(resolveVolumeManager("kernel", "parted")).toBe("parted");
  });

  test("identity is stable per UID and differs across UIDs", () => {
    expect(externalIdFor("a")).toBe(externalIdFor("a"));
    expect(externalIdFor("a")).not.toBe(externalIdFor("b"));
    expect(externalIdFor("a")).toMatch(/^vol-[0-9a-f]{20}$/);
  });
});
