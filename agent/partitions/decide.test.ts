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
    "kernel partition with rate limits",
    obs({
      partition: part((p) => {
        p.spec.backend = "kernel";
        p.spec.qos = { rwIosPerSec: 2000 };
      }),
    }),
    "refuse",
    "QosUnsupported",
  ],
  [
    "kernel partition whose limits are all 0 (unlimited)",
    obs({
      partition: part((p) => {
        p.spec.backend = "kernel";
        p.spec.qos = { rwIosPerSec: 0, rMBytesPerSec: 0 };
      }),
      device: dev((d) => delete d.status!.activeBackend),
    }),
    "provision",
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

  test("spec.qos is the whole desired state: absent limits (and an absent spec.qos) are 0", () => {
    const limited = decide(
      obs({ partition: part((x) => (x.spec.qos = { rwIosPerSec: 3000, wMBytesPerSec: 40 })) }),
    );
    expect(limited.action === "provision" && limited.target.qos).toEqual({
      rwIosPerSec: 3000,
      rwMBytesPerSec: 0,
      rMBytesPerSec: 0,
      wMBytesPerSec: 40,
    });
    const plain = decide(obs({}));
    expect(plain.action === "provision" && plain.target.qos).toEqual({
      rwIosPerSec: 0,
      rwMBytesPerSec: 0,
      rMBytesPerSec: 0,
      wMBytesPerSec: 0,
    });
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
