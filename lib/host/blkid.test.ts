// blkid verdicts: blank only on "nothing found", filesystems by TYPE, everything else is data.
import { expect, test } from "bun:test";
import { StorageError } from "../errors.ts";
import { blkidArgv, type DeviceContent, interpretBlkid } from "./blkid.ts";

test("argv is low-level probing with export output", () => {
  expect(blkidArgv("/dev/nvme1n1")).toEqual(["blkid", "-p", "-o", "export", "/dev/nvme1n1"]);
});

test.each<[string, number, string, DeviceContent]>([
  ["nothing found", 2, "", { kind: "blank" }],
  [
    "ext4",
    0,
    "DEVNAME=/dev/nvme1n1\nUUID=fe42d4e8-0f3f-4059-bc9b-7b326af92389\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n",
    { kind: "filesystem", fsType: "ext4" },
  ],
  [
    "ext4 on an NBD device",
    0,
    "DEVNAME=/dev/nbd0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n",
    { kind: "filesystem", fsType: "ext4" },
  ],
  [
    "xfs",
    0,
    "DEVNAME=/dev/loop0\nUUID=x\nBLOCK_SIZE=512\nTYPE=xfs\nUSAGE=filesystem\n",
    { kind: "filesystem", fsType: "xfs" },
  ],
  ["xfs without USAGE", 0, "TYPE=xfs\n", { kind: "filesystem", fsType: "xfs" }],
  [
    "swap counts as another filesystem",
    0,
    "TYPE=swap\nUSAGE=other\n",
    { kind: "other", description: "a swap signature (other)" },
  ],
  [
    "swap without USAGE is still not a filesystem",
    0,
    "TYPE=swap\n",
    { kind: "other", description: "a swap signature" },
  ],
  [
    "LVM",
    0,
    "TYPE=LVM2_member\nUSAGE=raid\n",
    { kind: "other", description: "a LVM2_member signature (raid)" },
  ],
  [
    "LUKS",
    0,
    "TYPE=crypto_LUKS\nUSAGE=crypto\n",
    { kind: "other", description: "a crypto_LUKS signature (crypto)" },
  ],
  [
    "GPT",
    0,
    "DEVNAME=/dev/nvme1n1\nPTUUID=abc\nPTTYPE=gpt\n",
    { kind: "other", description: "a gpt partition table" },
  ],
  ["a partition table", 0, "PTUUID=1\nPTTYPE=gpt\n", { kind: "other", description: "a gpt partition table" }],
  ["ambiguous", 8, "", { kind: "other", description: "ambiguous signatures (blkid exit 8)" }],
])("%s", (_name, code, stdout, want) => {
  expect(interpretBlkid({ code, stdout, stderr: "" })).toEqual(want);
});

test("a signature without a name is not blank", () => {
  expect(interpretBlkid({ code: 0, stdout: "DEVNAME=/dev/x\n", stderr: "" }).kind).toBe("other");
});

test("usage errors are errors", () => {
  expect(() => interpretBlkid({ code: 4, stdout: "", stderr: "blkid: bad usage" })).toThrow(StorageError);
  expect(() => interpretBlkid({ code: 4, stdout: "", stderr: "boom" })).toThrow("blkid exited 4");
});
