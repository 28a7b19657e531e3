// Mounted-disk detection from lsblk JSON: any mount (or swap) in a disk's subtree marks the disk.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { LSBLK_ARGV, mountedDisks, parseMountedDisks } from "./lsblk.ts";

const tree = (devices: unknown[]) => JSON.stringify({ blockdevices: devices });

test.each<[string, string, string[]]>([
  ["nothing mounted", tree([{ name: "nvme0n1", mountpoints: [null] }]), []],
  ["whole disk mounted", tree([{ name: "nvme0n1", mountpoints: ["/data"] }]), ["nvme0n1"]],
  [
    "partition mounted",
    tree([
      { name: "nvme0n1", mountpoints: [null], children: [{ name: "nvme0n1p1", mountpoints: ["/boot"] }] },
      { name: "nvme1n1", mountpoints: [null], children: [{ name: "nvme1n1p1", mountpoints: [null] }] },
    ]),
    ["nvme0n1"],
  ],
  [
    "logical volume on a partition mounted",
    tree([
      {
        name: "nvme2n1",
        mountpoints: [null],
        children: [
          { name: "nvme2n1p1", mountpoints: [null], children: [{ name: "vg-root", mountpoints: ["/"] }] },
        ],
      },
    ]),
    ["nvme2n1"],
  ],
  ["swap", tree([{ name: "nvme3n1", mountpoints: ["[SWAP]"] }]), ["nvme3n1"]],
  ["bind mounted twice", tree([{ name: "nvme4n1", mountpoints: ["/a", "/b"] }]), ["nvme4n1"]],
  ["older singular column", tree([{ name: "nvme5n1", mountpoint: "/x" }]), ["nvme5n1"]],
  ["no mountpoints key at all", tree([{ name: "nvme6n1" }]), []],
  ["empty host", tree([]), []],
])("%s", (_name, json, want) => {
  expect([...parseMountedDisks(json)].sort()).toEqual(want);
});

test.each([
  ["not JSON", "lsblk: unknown column: MOUNTPOINTS"],
  ["wrong top level", JSON.stringify({ devices: [] })],
  ["nameless device", tree([{ mountpoints: [null] }])],
  ["mountpoints not a list", tree([{ name: "x", mountpoints: "/" }])],
])("rejects %s", (_name, text) => {
  expect(() => parseMountedDisks(text)).toThrow(StorageError);
});

test("runs exactly lsblk -J -o NAME,MOUNTPOINTS and fails on a non-zero exit", async () => {
  const seen: (readonly string[])[] = [];
  const ok = await mountedDisks({
    run: async (argv) => {
      seen.push(argv);
      return { code: 0, stdout: tree([{ name: "nvme0n1", mountpoints: ["/"] }]), stderr: "" };
    },
  });
  expect(seen).toEqual([["lsblk", "-J", "-o", "NAME,MOUNTPOINTS"]]);
  expect(LSBLK_ARGV).toEqual(seen[0] as string[]);
  expect([...ok]).toEqual(["nvme0n1"]);
  const failing = mountedDisks({ run: async () => ({ code: 1, stdout: "", stderr: "lsblk: failed" }) });
  await expect(failing).rejects.toThrow(/lsblk: failed/);
});
