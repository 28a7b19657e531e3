// mount(8) argv: options only when there are any, joined by commas.
import { expect, test } from "bun:test";
import { mountArgv } from "./mount-argv.ts";

test.each<[string, string[], string[]]>([
  [
    "mount ext4 with flags",
    mountArgv("/dev/nvme1n1", "/stage", "ext4", ["noatime", "discard"]),
    ["mount", "-t", "ext4", "-o", "noatime,discard", "/dev/nvme1n1", "/stage"],
  ],
  [
    "mount xfs without flags",
    mountArgv("/dev/nvme1n1", "/stage", "xfs", []),
    ["mount", "-t", "xfs", "/dev/nvme1n1", "/stage"],
  ],
  [
    "read-only",
    mountArgv("/dev/nbd0", "/m", "ext4", ["ro"]),
    ["mount", "-t", "ext4", "-o", "ro", "/dev/nbd0", "/m"],
  ],
])("%s", (_name, got, want) => {
  expect(got).toEqual(want);
});
