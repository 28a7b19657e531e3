// mountinfo parsing: field layout with optional fields, octal escapes, bind roots, ro detection.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { mountsAt, parseMountinfo, parseMountinfoLine, unescapeMountField } from "./mountinfo.ts";

const TABLE = [
  "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro",
  "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
  "40 22 259:7 / /var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/ab12/globalmount rw,relatime shared:30 - xfs /dev/nvme3n1 rw,attr2,inode64,logbufs=8,noquota",
  "41 22 259:7 / /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1/mount ro,relatime shared:30 - xfs /dev/nvme3n1 rw,attr2,inode64,logbufs=8,noquota",
  "42 22 0:6 /nvme4n1 /var/lib/kubelet/pods/p2/volumeDevices/pvc-2/dev rw,nosuid master:2 - devtmpfs devtmpfs rw,size=1024k,mode=755",
  "43 22 7:1 / /mnt/with\\040space rw - ext4 /dev/loop1 rw",
  "44 22 7:1 / /mnt/with\\040space rw - ext4 /dev/loop1 rw",
  "",
].join("\n");

test("parses every line, optional fields and all", () => {
  const entries = parseMountinfo(TABLE);
  expect(entries).toHaveLength(7);
  expect(entries[2]).toEqual({
    id: 40,
    parentId: 22,
    majorMinor: "259:7",
    root: "/",
    mountPoint: "/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/ab12/globalmount",
    options: ["rw", "relatime"],
    fsType: "xfs",
    source: "/dev/nvme3n1",
    superOptions: ["rw", "attr2", "inode64", "logbufs=8", "noquota"],
    readonly: false,
  });
  expect(entries[3]?.readonly).toBe(true);
  expect(entries[4]?.root).toBe("/nvme4n1");
  expect(entries[4]?.majorMinor).toBe("0:6");
});

test("mountsAt finds stacked mounts on a path with an escaped space, bottom first", () => {
  const at = mountsAt(parseMountinfo(TABLE), "/mnt/with space");
  expect(at.map((e) => e.id)).toEqual([43, 44]);
  expect(mountsAt(parseMountinfo(TABLE), "/mnt")).toEqual([]);
});

test.each([
  ["\\040", " "],
  ["a\\011b", "a\tb"],
  ["\\012", "\n"],
  ["back\\134slash", "back\\slash"],
  ["plain", "plain"],
])("unescape %j", (raw, want) => {
  expect(unescapeMountField(raw)).toBe(want);
});

test.each([
  ["no separator", "22 1 259:2 / / rw,relatime shared:1 ext4 /dev/x rw"],
  ["bad device number", "22 1 x:y / / rw - ext4 /dev/x rw"],
  ["relative mount point", "22 1 8:1 / mnt rw - ext4 /dev/x rw"],
  ["truncated", "22 1 8:1 / /mnt rw -"],
  ["relative root", "22 1 8:1 sub /mnt rw - ext4 /dev/x rw"],
])("rejects %s", (_name, line) => {
  expect(() => parseMountinfoLine(line)).toThrow(StorageError);
});

test("a namespace file bind (ip netns add) has a namespace name for its root", () => {
  const [e] = parseMountinfo("43 42 0:4 net:[4026532178] /run/netns/lab-a rw shared:2 - nsfs nsfs rw\n");
  expect(e).toMatchObject({ root: "net:[4026532178]", mountPoint: "/run/netns/lab-a", fsType: "nsfs" });
  expect(() => parseMountinfo("43 42 0:4 net /run/netns/lab-a rw shared:2 - nsfs nsfs rw\n")).toThrow(
    "malformed",
  );
});
