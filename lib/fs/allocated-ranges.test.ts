// allocatedRanges on real sparse files in a temp directory: data written at known offsets comes
// back as exactly those ranges in whole file system blocks, holes stay out, an empty file is [].
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import {
  chmodSync,
  closeSync,
  ftruncateSync,
  mkdtempSync,
  openSync,
  rmSync,
  statfsSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../errors.ts";
import { allocatedRanges } from "./allocated-ranges.ts";

const KIB = 1024;
const MIB = 1024 * KIB;
let dir: string;
let block: number;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "distort-ranges-"));
  // The unit SEEK_DATA reports in (ext4, xfs, tmpfs: 4 KiB here); offsets below are multiples.
  block = statfsSync(dir).bsize;
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A sparse file of `size` bytes with `writes` ([offset, length]) filled with 0xab. */
function sparse(name: string, size: number, writes: readonly [number, number][]): string {
  const path = join(dir, name);
  const fd = openSync(path, "w");
  try {
    ftruncateSync(fd, size);
    for (const [offset, length] of writes) writeSync(fd, Buffer.alloc(length, 0xab), 0, length, offset);
  } finally {
    closeSync(fd);
  }
  return path;
}

describe("allocatedRanges", () => {
  test("the block size is one the ranges below are aligned to", () => {
    expect(block).toBeGreaterThan(0);
    expect((4 * KIB) % block === 0 || block % (4 * KIB) === 0).toBe(true);
  });

  test("data at 0, 5 MiB and 9 MiB (two blocks) of a 16 MiB file: exactly those ranges", () => {
    const unit = Math.max(block, 4 * KIB);
    const path = sparse("three.img", 16 * MIB, [
      [0, unit],
      [5 * MIB, unit],
      [9 * MIB, 2 * unit],
    ]);
    expect(allocatedRanges(path)).toEqual([
      { offset: 0, length: unit },
      { offset: 5 * MIB, length: unit },
      { offset: 9 * MIB, length: 2 * unit },
    ]);
  });

  test("a small write inside a block makes the whole block data", () => {
    const path = sparse("partial.img", 8 * MIB, [[3 * MIB + 100, 10]]);
    expect(allocatedRanges(path)).toEqual([{ offset: 3 * MIB, length: block }]);
  });

  test("a write crossing a block boundary gives one range of both blocks", () => {
    const path = sparse("cross.img", 8 * MIB, [[2 * MIB + block - 1, 2]]);
    expect(allocatedRanges(path)).toEqual([{ offset: 2 * MIB, length: 2 * block }]);
  });

  test("data at the very end of the file ends the last range at the file size", () => {
    const path = sparse("tail.img", 4 * MIB, [[4 * MIB - block, block]]);
    expect(allocatedRanges(path)).toEqual([{ offset: 4 * MIB - block, length: block }]);
  });

  test("an empty sparse file and a zero-length file give []", () => {
    expect(allocatedRanges(sparse("empty.img", 32 * MIB, []))).toEqual([]);
    expect(allocatedRanges(sparse("zero.img", 0, []))).toEqual([]);
  });

  test("a missing file is StorageError not-found naming the path", () => {
    const path = join(dir, "missing.img");
    let caught: unknown;
    try {
      allocatedRanges(path);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(StorageError);
    expect((caught as StorageError).kind).toBe("not-found");
    expect((caught as StorageError).message).toContain(path);
  });

  test("an unreadable file is StorageError precondition (skipped as root, who may read anything)", () => {
    if (process.getuid?.() === 0) return;
    const path = sparse("locked.img", MIB, [[0, block]]);
    chmodSync(path, 0o000);
    expect(() => allocatedRanges(path)).toThrow(StorageError);
    try {
      allocatedRanges(path);
    } catch (err) {
      expect((err as StorageError).kind).toBe("precondition");
    }
  });
});
