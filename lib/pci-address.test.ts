// PCI address normalization: the spellings sysfs and SPDK print, odd ones operators type, and junk.
import { expect, test } from "bun:test";
import { normalizePciAddress } from "./pci-address.ts";

test.each([
  ["0000:3b:00.0", "0000:3b:00.0"],
  ["0000:3B:00.0", "0000:3b:00.0"],
  [" 0000:5e:00.1\n", "0000:5e:00.1"],
  ["3b:00.0", "0000:3b:00.0"],
  ["0:3b:0.0", "0000:3b:00.0"],
  ["10000:01:00.0", "10000:01:00.0"], // VMD domain
  ["0000:00:1f.7", "0000:00:1f.7"],
])("%p -> %p", (raw, want) => {
  expect(normalizePciAddress(raw)).toBe(want);
});

test.each([
  "",
  "nvme0",
  "0000:3b:00",
  "0000:3b:20.0", // device above 0x1f
  "0000:3b:00.8", // function above 7
  "000000000:3b:00.0", // domain over 8 digits
  "traddr=192.168.1.1,trsvcid=4420",
  "0000:3b:00.0.0",
])("%p is not a PCI address", (raw) => {
  expect(normalizePciAddress(raw)).toBeUndefined();
});
