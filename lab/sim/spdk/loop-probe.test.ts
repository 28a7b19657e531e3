// The sysfs loop probe against a fabricated /sys/block: overlap with a device's window (a size
// limit of 0 runs to the end of the file), other files, paths through symlinks, detached devices.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sysfsLoopProbe } from "./loop-probe.ts";

const MIB = 1024 * 1024;
let root: string;
let file: string;

function loop(n: number, backing: string, offset: number, sizelimit: number): void {
  const dir = join(root, "block", `loop${n}`, "loop");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "backing_file"), `${backing}\n`);
  writeFileSync(join(dir, "offset"), `${offset}\n`);
  writeFileSync(join(dir, "sizelimit"), `${sizelimit}\n`);
}

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "loop-probe-"));
  file = join(root, "drive.img");
  writeFileSync(file, "");
  symlinkSync(file, join(root, "link.img"));
  loop(0, file, 8 * MIB, 4 * MIB);
  loop(1, join(root, "other.img"), 0, 0);
  loop(2, `${file} (deleted)`, 0, 0);
  // A loop device that is not attached has no loop/ directory.
  mkdirSync(join(root, "block", "loop3"), { recursive: true });
  mkdirSync(join(root, "block", "sda"), { recursive: true });
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

test.each([
  [0, 8 * MIB, false], // ends where the window starts
  [8 * MIB, 4 * MIB, true], // the window itself
  [11 * MIB, 4 * MIB, true], // overlaps its end
  [12 * MIB, 4 * MIB, false], // starts where it ends
])("an extent at %d of %d bytes is mapped: %p", (offset, length, want) => {
  const probe = sysfsLoopProbe(join(root, "block"));
  expect(probe({ path: file, offset, length })).toBe(want);
  // The same file through a symlink is the same file.
  expect(probe({ path: join(root, "link.img"), offset, length })).toBe(want);
});

test("a device without a size limit maps to the end of its file; other files do not count", () => {
  loop(4, file, 100 * MIB, 0);
  const probe = sysfsLoopProbe(join(root, "block"));
  expect(probe({ path: file, offset: 1024 * MIB, length: 4 * MIB })).toBe(true);
  rmSync(join(root, "block", "loop4"), { recursive: true });
  expect(probe({ path: file, offset: 1024 * MIB, length: 4 * MIB })).toBe(false);
  expect(probe({ path: join(root, "missing.img"), offset: 0, length: 4 * MIB })).toBe(false);
  expect(sysfsLoopProbe(join(root, "nonexistent"))({ path: file, offset: 8 * MIB, length: 1 })).toBe(false);
});
