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

const DELETED = "2026-02-01T10:00:00Z";
const LOST = "2026-02-01T10:05:00Z";
const BOUND = 600_000;
/** The latest moment a whole-second API time can stand for (the bound counts from there). */
const end = (iso: string) => Date.parse(iso) + 999;
const deleting = () => part((p) => (p.metadata.deletionTimestamp = DELETED));
/** The drive as the reporter leaves it after a complete scan missed it at `since`. */
const lostDev = (since: string) =>
  dev((d) => {
    d.status!.phase = "Unavailable";
    d.status!.conditions = [
      { type: "Present", status: "False", reason: "NotFound", message: "", lastTransitionTime: since },
    ];
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
  // A drive lost while its partition is deleted: the bound runs from when the drive went missing
  // (Present=False), or from the deletion request when the NVMeDevice itself was removed.
  [
    "deleting, NVMeDevice removed, within the bound",
    obs({
      partition: deleting(),
      device: undefined,
      nowMs: end(DELETED) + BOUND - 1,
      lostDriveReleaseAfterMs: BOUND,
    }),
    "wait-lost-drive",
    "DeviceUnavailable",
  ],
  [
    "deleting, NVMeDevice removed, past the bound",
    obs({
      partition: deleting(),
      device: undefined,
      nowMs: end(DELETED) + BOUND,
      lostDriveReleaseAfterMs: BOUND,
    }),
    "abandon",
    "DataOnLostDevice",
  ],
  [
    "deleting, drive Unavailable for less than the bound",
    obs({
      partition: deleting(),
      device: lostDev(LOST),
      nowMs: Date.parse(LOST) + BOUND, // the stored second may round the loss down
      lostDriveReleaseAfterMs: BOUND,
    }),
    "wait-lost-drive",
    "DeviceUnavailable",
  ],
  [
    "deleting, drive Unavailable past the bound (counted from Present=False, not the deletion)",
    obs({
      partition: deleting(),
      device: lostDev("2026-01-01T00:00:00Z"),
      nowMs: Date.parse(DELETED) + 1,
      lostDriveReleaseAfterMs: BOUND,
    }),
    "abandon",
    "DataOnLostDevice",
  ],
  [
    "deleting a copy of a replicated volume, its drive Unavailable past the bound",
    obs({
      partition: part((p) => {
        p.metadata.deletionTimestamp = DELETED;
        p.spec.replicaOf = { name: "vol", uid: "uid-vol" };
      }),
      device: lostDev("2026-01-01T00:00:00Z"),
      nowMs: Date.parse(DELETED) + 1,
      lostDriveReleaseAfterMs: BOUND,
    }),
    "abandon",
    "DataOnLostDevice",
  ],
  [
    "deleting, drive Unavailable past the bound, but attachments remain",
    obs({
      partition: deleting(),
      device: lostDev("2026-01-01T00:00:00Z"),
      attachments: ["va-1"],
      nowMs: Date.parse(DELETED) + 1,
      lostDriveReleaseAfterMs: BOUND,
    }),
    "block-deletion",
    "AttachmentsExist",
  ],
  [
    "deleting, drive back (Present=True again): deleted as usual whatever the clock",
    obs({
      partition: deleting(),
      device: dev((d) => {
        d.status!.phase = "Claimed";
        d.status!.conditions = [
          { type: "Present", status: "True", reason: "BoundToSpdk", message: "", lastTransitionTime: LOST },
        ];
      }),
      nowMs: Date.parse(LOST) + 10 * BOUND,
      lostDriveReleaseAfterMs: BOUND,
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

  test("an abandoned partition's leftover says what was lost, when, and names the drive and node", () => {
    const now = end(LOST) + BOUND;
    const d = decide(
      obs({ partition: deleting(), device: lostDev(LOST), nowMs: now, lostDriveReleaseAfterMs: BOUND }),
    );
    if (d.action !== "abandon") throw new Error(d.action);
    expect(d.leftover).toEqual({ since: new Date(now).toISOString(), reason: "DeviceUnavailable" });
    expect(d.why.message).toContain(`drive ${part().spec.deviceSerial}`);
    expect(d.why.message).toContain("on node-a");
    const gone = decide(obs({ partition: deleting(), device: undefined, nowMs: now + BOUND }));
    expect(gone.action === "abandon" && gone.leftover.reason).toBe("DeviceRemoved");
  });

  test("the wait names the moment of release, which stays the same from pass to pass", () => {
    const at = (nowMs: number) =>
      decide(obs({ partition: deleting(), device: lostDev(LOST), nowMs, lostDriveReleaseAfterMs: BOUND }));
    const a = at(Date.parse(LOST) + 1000);
    const b = at(Date.parse(LOST) + 5000);
    if (a.action !== "wait-lost-drive" || b.action !== "wait-lost-drive") throw new Error("no wait");
    expect(a.why.message).toBe(b.why.message);
    expect(a.why.message).toContain(new Date(end(LOST) + BOUND).toISOString());
    expect(b.retryAfterMs).toBeLessThanOrEqual(60_000);
  });

  test("status.externalId never redirects identity: export and deletion use the UID's", () => {
    const own = externalIdFor(part().metadata.uid as string);
    const forged = (x: NVMePartition) =>
      (x.status = { state: "Exported", externalId: "vol-0123456789abcdef0123", conditions: [] });
    const d = decide(obs({ partition: part(forged) }));
    if (d.action !== "provision") throw new Error(d.action);
    expect(d.target.nqn).toBe(nqnFor(own));
    expect(d.target.volume.externalId).toBe(own);
    const del = decide(
      obs({
        partition: part((x) => {
          forged(x);
          x.metadata.deletionTimestamp = "2026-02-01T10:00:00Z";
        }),
      }),
    );
    if (del.action !== "deprovision") throw new Error(del.action);
    expect(del.target.volume.externalId).toBe(own);
  });

  describe("contentSource is resolved by kind, name and UID in the partition's namespace", () => {
    const SERIAL = "S4EWNX0R123456";
    const clone = (x: NVMePartition) =>
      (x.spec.contentSource = {
        kind: "Snapshot",
        name: "snap-1",
        uid: "7c9e6679-7425-40de-944b-e07fc1f90ae7",
      });
    const found = { uid: "7c9e6679-7425-40de-944b-e07fc1f90ae7", deviceSerial: SERIAL };
    const table: [string, Observed["contentSource"], Decision["action"], string?][] = [
      ["the named object with that UID on this drive", found, "provision"],
      ["nothing of that name in the namespace", null, "refuse", "ContentSourceNotFound"],
      ["not looked up", undefined, "refuse", "ContentSourceNotFound"],
      ["that name holds another UID", { ...found, uid: "other" }, "refuse", "ContentSourceNotFound"],
      ["on another drive", { ...found, deviceSerial: "OTHER" }, "refuse", "ContentSourceElsewhere"],
    ];
    for (const [name, contentSource, action, reason] of table) {
      test(name, () => {
        const d = decide(obs({ partition: part(clone), contentSource }));
        expect(d.action).toBe(action);
        if (reason) expect((d as { why: { reason: string } }).why.reason).toBe(reason);
      });
    }
    test("once Exported the copy exists: a gone source no longer matters", () => {
      const p = part((x) => {
        clone(x);
        x.status = { state: "Exported", conditions: [] };
      });
      expect(decide(obs({ partition: p, contentSource: null })).action).toBe("provision");
    });
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
