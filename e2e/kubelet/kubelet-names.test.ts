// The names and paths kubelet derives for CSI volumes and its access-mode, capability and quantity
// mapping, as the e2e suites use them to find a real kubelet's staging and publish paths.
import { describe, expect, test } from "bun:test";
import { VolumeCapability_AccessMode_Mode as Mode } from "../../gen/csi/v1/csi_pb.ts";
import {
  attachmentName,
  podDir,
  publicationRecordDir,
  publishPath,
  sha256Hex,
  stagingPath,
  stagingRecordDir,
  uniqueVolumeName,
} from "./naming.ts";
import { csiAccessMode, quantityBytes, volumeCapabilityOf, volumeModeOf } from "./volume-spec.ts";

const DRIVER = "storage.distort.io";
const HANDLE = "distort-system/pvc-1234/0f0e0d0c-aaaa-bbbb-cccc-123456789abc";

describe("names and paths", () => {
  test("the VolumeAttachment name is csi-<sha256(handle + driver + node)>", () => {
    // Computed outside this code: printf '%s' "<handle>storage.distort.ioworker-1" | sha256sum
    expect(attachmentName(HANDLE, DRIVER, "worker-1")).toBe(
      "csi-61608c7aff43ded376a442ea4d9df72085a3f91c4e94fe54ccb16771ebc4acb7",
    );
    expect(attachmentName(HANDLE, DRIVER, "worker-2")).not.toBe(attachmentName(HANDLE, DRIVER, "worker-1"));
    expect(sha256Hex("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  });

  test("the unique volume name is kubernetes.io/csi/<driver>^<handle>", () => {
    expect(uniqueVolumeName(DRIVER, HANDLE)).toBe(`kubernetes.io/csi/storage.distort.io^${HANDLE}`);
  });

  test("filesystem volumes stage under the handle's sha256 and publish under the Pod", () => {
    const root = "/lab/w1/var/lib/kubelet";
    const o = { driver: DRIVER, volumeHandle: HANDLE, pvName: "pv-a", mode: "Filesystem" as const };
    // printf '%s' "<handle>" | sha256sum
    const sha = "d4bac248801756a6cb9fbd001760c7cfa596ad1d23bf2f733097594659bdeabd";
    expect(stagingPath(root, o)).toBe(
      `${root}/plugins/kubernetes.io/csi/storage.distort.io/${sha}/globalmount`,
    );
    expect(stagingRecordDir(root, o)).toBe(`${root}/plugins/kubernetes.io/csi/storage.distort.io/${sha}`);
    const pod = { podUID: "uid-1", pvName: "pv-a", mode: "Filesystem" as const };
    expect(publishPath(root, pod)).toBe(`${root}/pods/uid-1/volumes/kubernetes.io~csi/pv-a/mount`);
    expect(publicationRecordDir(root, pod)).toBe(`${root}/pods/uid-1/volumes/kubernetes.io~csi/pv-a`);
    expect(podDir(root, "uid-1")).toBe(`${root}/pods/uid-1`);
  });

  test("block volumes use the volumeDevices tree", () => {
    const root = "/k";
    const o = { driver: DRIVER, volumeHandle: HANDLE, pvName: "pv-b", mode: "Block" as const };
    expect(stagingPath(root, o)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/staging/pv-b");
    expect(stagingRecordDir(root, o)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/pv-b/data");
    const pod = { podUID: "uid-2", pvName: "pv-b", mode: "Block" as const };
    expect(publishPath(root, pod)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-b/uid-2");
    expect(publicationRecordDir(root, pod)).toBe("/k/pods/uid-2/volumeDevices/kubernetes.io~csi/pv-b");
  });
});

describe("volume spec", () => {
  test("access modes map as kubelet maps them, by the first mode", () => {
    expect(csiAccessMode(["ReadWriteOnce"])).toBe(Mode.SINGLE_NODE_WRITER);
    expect(csiAccessMode(["ReadWriteMany"])).toBe(Mode.MULTI_NODE_MULTI_WRITER);
    expect(csiAccessMode(["ReadOnlyMany"])).toBe(Mode.MULTI_NODE_READER_ONLY);
    expect(csiAccessMode(["ReadWriteOncePod"])).toBe(Mode.SINGLE_NODE_SINGLE_WRITER);
    expect(csiAccessMode(["ReadWriteOncePod", "ReadWriteMany"])).toBe(Mode.SINGLE_NODE_SINGLE_WRITER);
    expect(csiAccessMode(undefined)).toBe(Mode.SINGLE_NODE_WRITER);
    expect(csiAccessMode(["Sideways"])).toBe(Mode.UNKNOWN);
  });

  test("the capability is a mount with the PV's fsType (ext4 by default) and mount options, or block", () => {
    expect(
      volumeCapabilityOf({
        spec: { accessModes: ["ReadWriteOnce"], csi: { driver: DRIVER, volumeHandle: "h" } },
      }),
    ).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_WRITER },
      accessType: { case: "mount", value: { fsType: "ext4", mountFlags: [] } },
    });
    expect(
      volumeCapabilityOf({
        spec: {
          accessModes: ["ReadWriteOncePod"],
          mountOptions: ["noatime"],
          csi: { driver: DRIVER, volumeHandle: "h", fsType: "xfs" },
        },
      }),
    ).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_SINGLE_WRITER },
      accessType: { case: "mount", value: { fsType: "xfs", mountFlags: ["noatime"] } },
    });
    const block = {
      spec: { volumeMode: "Block", csi: { driver: DRIVER, volumeHandle: "h", fsType: "xfs" } },
    };
    expect(volumeModeOf(block)).toBe("Block");
    expect(volumeCapabilityOf(block)).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_WRITER },
      accessType: { case: "block", value: {} },
    });
  });

  test("quantities become whole bytes, rounded up", () => {
    expect(quantityBytes("1Gi")).toBe(1073741824n);
    expect(quantityBytes("256Mi")).toBe(268435456n);
    expect(quantityBytes("1.5Gi")).toBe(1610612736n);
    expect(quantityBytes("2G")).toBe(2000000000n);
    expect(quantityBytes("500k")).toBe(500000n);
    expect(quantityBytes("1536")).toBe(1536n);
    expect(quantityBytes("2e3")).toBe(2000n);
    expect(quantityBytes("1500m")).toBe(2n);
    expect(quantityBytes("0.1")).toBe(1n);
    expect(() => quantityBytes("-1Gi")).toThrow("not a size quantity");
    expect(() => quantityBytes("1GiB")).toThrow("not a size quantity");
  });
});
