// Tests for the parted machine-output parser, on output captured from GNU parted 3.5 over loop
// devices (512-byte and 4 KiB sectors, blank, GPT, a whole-disk filesystem), and on malformed input.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../../lib/errors.ts";
import { parsePartedPrint, splitRecord } from "./parted-output.ts";

const BLANK = "BYT;\n/dev/loop0:67108864B:loopback:512:512:unknown:Loopback device:;\n";

const GPT_FREE = `BYT;
/dev/loop0:67108864B:loopback:512:512:gpt:Loopback device:;
1:17408B:4194303B:4176896B:free;
1:4194304B:12582911B:8388608B::vol-a:raid;
1:12582912B:20971519B:8388608B:free;
2:20971520B:29360127B:8388608B::we\\:ird\\\\name:;
1:29360128B:67091967B:37731840B:free;
`;

const SECTOR_4K = `BYT;
/dev/loop0:67108864B:loopback:4096:4096:gpt:Loopback device:;
1:24576B:4194303B:4169728B:free;
1:4194304B:8388607B:4194304B::vol-b:;
1:8388608B:67088383B:58699776B:free;
`;

// An ext4 made on the whole disk: parted reports a "loop" label with one pseudo-partition.
const WHOLE_DISK_FS = `BYT;
/dev/loop0:67108864B:loopback:512:512:loop:Loopback device:;
1:0B:67108863B:67108864B:ext4::;
`;

// parted before 3.2 printed no disk-flags field.
const OLD_PARTED = `BYT;
/dev/sdb:1000204886016B:scsi:512:4096:gpt:ATA Samsung SSD 860:;
1:1048576B:10486808575B:10485760000B:ext4:data:boot, esp;
`;

describe("parsePartedPrint", () => {
  test("a blank disk: no label, nothing else", () => {
    expect(parsePartedPrint(BLANK)).toEqual({
      disk: {
        path: "/dev/loop0",
        sizeBytes: 67108864,
        transport: "loopback",
        logicalSectorSize: 512,
        physicalSectorSize: 512,
        table: "unknown",
        model: "Loopback device",
        flags: "",
      },
      partitions: [],
      free: [],
    });
  });

  test("GPT with partitions and free space, escaped names and flags", () => {
    const t = parsePartedPrint(GPT_FREE);
    expect(t.disk.table).toBe("gpt");
    expect(t.partitions).toEqual([
      {
        number: 1,
        start: 4194304,
        end: 12582911,
        sizeBytes: 8388608,
        filesystem: "",
        name: "vol-a",
        flags: ["raid"],
      },
      {
        number: 2,
        start: 20971520,
        end: 29360127,
        sizeBytes: 8388608,
        filesystem: "",
        name: "we:ird\\name",
        flags: [],
      },
    ]);
    expect(t.free).toEqual([
      { start: 17408, end: 4194303, sizeBytes: 4176896 },
      { start: 12582912, end: 20971519, sizeBytes: 8388608 },
      { start: 29360128, end: 67091967, sizeBytes: 37731840 },
    ]);
  });

  test("4 KiB sectors move the usable area but not the format", () => {
    const t = parsePartedPrint(SECTOR_4K);
    expect(t.disk.logicalSectorSize).toBe(4096);
    expect(t.free[0]).toEqual({ start: 24576, end: 4194303, sizeBytes: 4169728 });
    expect(t.partitions.map((p) => p.name)).toEqual(["vol-b"]);
  });

  test("a filesystem on the whole disk shows as a loop label", () => {
    const t = parsePartedPrint(WHOLE_DISK_FS);
    expect(t.disk.table).toBe("loop");
    expect(t.partitions[0]?.filesystem).toBe("ext4");
  });

  test("older parted without the disk flags field, and several flags", () => {
    const t = parsePartedPrint(OLD_PARTED);
    expect(t.disk).toMatchObject({
      path: "/dev/sdb",
      physicalSectorSize: 4096,
      model: "ATA Samsung SSD 860",
      flags: "",
    });
    expect(t.partitions[0]?.flags).toEqual(["boot", "esp"]);
  });

  test.each([
    ["empty output", "", "BYT"],
    ["another unit", "CHS;\n/dev/loop0:1:loopback:512:512:gpt:x:;\n", "BYT"],
    ["no disk line", "BYT;\n", "no disk line"],
    ["a disk size without unit", "BYT;\n/dev/loop0:67108864:loopback:512:512:gpt:x:;\n", "byte count"],
    ["a truncated partition line", `${BLANK}1:4194304B:12582911B;\n`, "1:4194304B"],
    [
      "a size that disagrees with start and end",
      `${BLANK}1:4194304B:12582911B:8388607B::vol-a:;\n`,
      "disagree",
    ],
    ["a free line with garbage", `${BLANK}1:x:4194303B:4176896B:free;\n`, "byte count"],
    [
      "a partition number that is not a number",
      `${BLANK}one:4194304B:12582911B:8388608B::vol-a:;\n`,
      "number",
    ],
    ["an end before the start", `${BLANK}1:4194304B:4194300B:0B::vol-a:;\n`, "disagree"],
  ])("rejects %s", (_name, out, why) => {
    let err: unknown;
    try {
      parsePartedPrint(out);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("internal");
    expect((err as StorageError).message).toContain(why);
  });
});

test("splitRecord honours backslash escapes and the record terminator", () => {
  expect(splitRecord("a:b\\:c:d\\\\:;")).toEqual(["a", "b:c", "d\\", ""]);
  expect(splitRecord("1:2")).toEqual(["1", "2"]);
});
