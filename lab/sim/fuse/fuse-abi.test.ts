// The FUSE struct encodings against the byte layouts of include/uapi/linux/fuse.h.
import { describe, expect, test } from "bun:test";
import {
  DT_REG,
  encodeAttrOut,
  encodeDirents,
  encodeEntryOut,
  encodeInitOut,
  FUSE_MINOR,
  Init,
  negotiateInit,
  outHeader,
  parseName,
  parseRequest,
  S_IFREG,
} from "./fuse-abi.ts";
import { fuseConnectionId, mountTable } from "./mount-syscalls.ts";

const le = (b: Uint8Array) => new DataView(b.buffer, b.byteOffset, b.byteLength);

describe("fuse-abi", () => {
  test("parses the in header and keeps the body as a view after it", () => {
    const b = new Uint8Array(48);
    const v = le(b);
    v.setUint32(0, 46, true);
    v.setUint32(4, 1, true); // LOOKUP
    v.setBigUint64(8, 0x1_0000_0002n, true);
    v.setBigUint64(16, 1n, true);
    v.setUint32(32, 4242, true);
    b.set(new TextEncoder().encode("disk\0"), 40);
    const r = parseRequest(b.buffer);
    expect(r).toMatchObject({ len: 46, opcode: 1, unique: 0x1_0000_0002n, nodeid: 1, pid: 4242 });
    expect(r.body.byteLength).toBe(6);
    expect(parseName(r.body)).toBe("disk");
  });

  test("refuses a request shorter than its header or than it claims", () => {
    expect(() => parseRequest(new ArrayBuffer(20))).toThrow(RangeError);
    const b = new Uint8Array(40);
    le(b).setUint32(0, 80, true);
    expect(() => parseRequest(b.buffer)).toThrow(RangeError);
  });

  test("an error reply is a bare header with the negated errno", () => {
    const h = le(outHeader(7n, 5, 0));
    expect([h.getUint32(0, true), h.getInt32(4, true), h.getBigUint64(8, true)]).toEqual([16, -5, 7n]);
  });

  test("INIT takes the smaller minor and only flags both sides have", () => {
    const out = negotiateInit({ major: 7, minor: 45, maxReadahead: 1 << 20, flags: 0xffff_ffff }, 1 << 20);
    expect(out.minor).toBe(FUSE_MINOR);
    expect(out.flags).toBe(
      Init.ASYNC_READ | Init.BIG_WRITES | Init.ASYNC_DIO | Init.ABORT_ERROR | Init.MAX_PAGES,
    );
    expect(out.maxPages).toBe(256);
    expect(
      negotiateInit({ major: 7, minor: 26, maxReadahead: 0, flags: Init.ASYNC_READ }, 4096),
    ).toMatchObject({
      minor: 26,
      flags: Init.ASYNC_READ,
    });
    expect(() => negotiateInit({ major: 8, minor: 0, maxReadahead: 0, flags: 0 }, 4096)).toThrow();
    const enc = le(encodeInitOut(out));
    expect(enc.byteLength).toBe(64);
    expect([
      enc.getUint32(0, true),
      enc.getUint32(4, true),
      enc.getUint32(20, true),
      enc.getUint16(28, true),
    ]).toEqual([7, FUSE_MINOR, 1 << 20, 256]);
  });

  test("entry and attr replies put fuse_attr at offsets 40 and 16", () => {
    const attr = { ino: 9, size: 1 << 20, mode: S_IFREG | 0o600, nlink: 1, uid: 0, gid: 0, time: 100 };
    const e = le(encodeEntryOut(9, attr));
    expect(e.byteLength).toBe(128);
    expect([e.getBigUint64(0, true), e.getBigUint64(48, true), e.getBigUint64(56, true)]).toEqual([
      9n,
      1n << 20n,
      2048n,
    ]);
    expect(e.getUint32(40 + 60, true)).toBe(S_IFREG | 0o600);
    const a = le(encodeAttrOut(attr));
    expect(a.byteLength).toBe(104);
    expect([a.getBigUint64(16, true), a.getBigUint64(24, true), a.getUint32(16 + 80, true)]).toEqual([
      9n,
      1n << 20n,
      4096,
    ]);
  });

  test("dirents are 8-byte aligned, carry the next index as offset and stop at the size limit", () => {
    const entries = [
      { ino: 1, name: ".", type: 4 },
      { ino: 2, name: "disk-a", type: DT_REG },
      { ino: 3, name: "x", type: DT_REG },
    ];
    const all = encodeDirents(entries, 0, 4096);
    expect(all.length).toBe(32 + 32 + 32);
    const v = le(all);
    expect([
      v.getBigUint64(32, true),
      v.getBigUint64(40, true),
      v.getUint32(48, true),
      v.getUint32(52, true),
    ]).toEqual([2n, 2n, 6, DT_REG]);
    expect(new TextDecoder().decode(all.subarray(56, 62))).toBe("disk-a");
    expect(encodeDirents(entries, 1, 40).length).toBe(32);
    expect(encodeDirents(entries, 3, 4096).length).toBe(0);
  });

  test("the fusectl connection number comes from the mount's st_dev in mountinfo", () => {
    const table = mountTable(
      [
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
        "90 27 0:57 / /tmp/a\\040b rw,nosuid,nodev,relatime - fuse.distort-block distort-block rw,user_id=0",
        "91 27 0:58 / /sys/fs/fuse/connections rw - fusectl fusectl rw",
      ].join("\n"),
    );
    expect(fuseConnectionId("/tmp/a b", table)).toBe(57);
    expect(fuseConnectionId("/", table)).toBeUndefined();
  });
});
