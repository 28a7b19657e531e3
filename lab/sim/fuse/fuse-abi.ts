// The FUSE kernel protocol as this server speaks it: opcodes, flags, errno values and the byte
// layouts of the request and reply structs it uses (little-endian, from include/uapi/linux/fuse.h).
// Pure encoding and decoding; nothing here touches /dev/fuse.

/** The protocol version this server implements. */
export const FUSE_MAJOR = 7;
/**
 * Minor 31 (Linux 5.8): the oldest minor that has everything used here (FALLOCATE 7.19, ASYNC_DIO
 * 7.22, ABORT_ERROR 7.27, MAX_PAGES 7.28) and none of the later extensions that change what the
 * kernel sends (INIT_EXT and flags2 7.36, security-context and supplementary-group extensions after
 * the in header 7.36/7.40, STATX 7.39, passthrough 7.40, io_uring 7.42, request timeouts 7.43).
 * The kernel uses the smaller of its minor and ours, so newer kernels speak 7.31 with us.
 */
export const FUSE_MINOR = 31;

export const FUSE_ROOT_ID = 1;

export const Op = {
  LOOKUP: 1,
  FORGET: 2,
  GETATTR: 3,
  SETATTR: 4,
  READLINK: 5,
  SYMLINK: 6,
  MKNOD: 8,
  MKDIR: 9,
  UNLINK: 10,
  RMDIR: 11,
  RENAME: 12,
  LINK: 13,
  OPEN: 14,
  READ: 15,
  WRITE: 16,
  STATFS: 17,
  RELEASE: 18,
  FSYNC: 20,
  SETXATTR: 21,
  GETXATTR: 22,
  LISTXATTR: 23,
  REMOVEXATTR: 24,
  FLUSH: 25,
  INIT: 26,
  OPENDIR: 27,
  READDIR: 28,
  RELEASEDIR: 29,
  FSYNCDIR: 30,
  ACCESS: 34,
  CREATE: 35,
  INTERRUPT: 36,
  DESTROY: 38,
  BATCH_FORGET: 42,
  FALLOCATE: 43,
  RENAME2: 45,
} as const;

/** INIT flags (fuse_init_in/out.flags) this server asks for when the kernel offers them. */
export const Init = {
  ASYNC_READ: 1 << 0,
  BIG_WRITES: 1 << 5,
  ASYNC_DIO: 1 << 15,
  ABORT_ERROR: 1 << 21,
  MAX_PAGES: 1 << 22,
} as const;

export const FOPEN_DIRECT_IO = 1 << 0;
export const FATTR_SIZE = 1 << 3;

export const FALLOC_FL_KEEP_SIZE = 0x01;
export const FALLOC_FL_PUNCH_HOLE = 0x02;
export const FALLOC_FL_ZERO_RANGE = 0x10;

/** The Linux errno values the server answers with (positive). */
export const Errno = {
  EPERM: 1,
  ENOENT: 2,
  EIO: 5,
  ENODEV: 19,
  ENOTDIR: 20,
  EISDIR: 21,
  EINVAL: 22,
  ENOSPC: 28,
  ENOSYS: 38,
  EPROTO: 71,
  EOPNOTSUPP: 95,
} as const;

export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
export const DT_DIR = 4;
export const DT_REG = 8;

export const IN_HEADER_SIZE = 40;
export const OUT_HEADER_SIZE = 16;
export const WRITE_IN_SIZE = 40;
const ATTR_SIZE = 88;
const DIRENT_NAME_OFFSET = 24;

/** struct fuse_in_header plus a view on the request's body. */
export interface Request {
  len: number;
  opcode: number;
  unique: bigint;
  nodeid: number;
  uid: number;
  gid: number;
  pid: number;
  /** The bytes after the header (the opcode's argument struct and any payload). */
  body: DataView;
}

/** Decodes one request as read from /dev/fuse; throws RangeError for a truncated one. */
export function parseRequest(buf: ArrayBuffer): Request {
  if (buf.byteLength < IN_HEADER_SIZE) throw new RangeError(`FUSE request of ${buf.byteLength} bytes`);
  const v = new DataView(buf);
  const len = v.getUint32(0, true);
  if (len > buf.byteLength || len < IN_HEADER_SIZE) {
    throw new RangeError(`FUSE request claims ${len} bytes, read ${buf.byteLength}`);
  }
  return {
    len,
    opcode: v.getUint32(4, true),
    unique: v.getBigUint64(8, true),
    nodeid: Number(v.getBigUint64(16, true)),
    uid: v.getUint32(24, true),
    gid: v.getUint32(28, true),
    pid: v.getUint32(32, true),
    body: new DataView(buf, IN_HEADER_SIZE, len - IN_HEADER_SIZE),
  };
}

/** A u64 field as a JS number (exact below 2^53, which covers every size and offset here). */
export function u64(v: DataView, at: number): number {
  return Number(v.getBigUint64(at, true));
}

/** struct fuse_out_header for a reply of `payloadLen` bytes; `errno` positive, 0 for success. */
export function outHeader(unique: bigint, errno: number, payloadLen: number): Uint8Array {
  const b = new Uint8Array(OUT_HEADER_SIZE);
  const v = new DataView(b.buffer);
  v.setUint32(0, OUT_HEADER_SIZE + payloadLen, true);
  v.setInt32(4, -errno, true);
  v.setBigUint64(8, unique, true);
  return b;
}

/** What the kernel offered in FUSE_INIT. */
export interface InitIn {
  major: number;
  minor: number;
  maxReadahead: number;
  flags: number;
}

export function parseInitIn(body: DataView): InitIn {
  return {
    major: body.getUint32(0, true),
    minor: body.getUint32(4, true),
    maxReadahead: body.getUint32(8, true),
    flags: body.getUint32(12, true),
  };
}

/** What this server answers to FUSE_INIT. */
export interface InitOut {
  minor: number;
  maxReadahead: number;
  flags: number;
  maxBackground: number;
  congestionThreshold: number;
  maxWrite: number;
  maxPages: number;
}

/** struct fuse_init_out (64 bytes: the full layout the kernel accepts from minor 23 on). */
export function encodeInitOut(o: InitOut): Uint8Array {
  const b = new Uint8Array(64);
  const v = new DataView(b.buffer);
  v.setUint32(0, FUSE_MAJOR, true);
  v.setUint32(4, o.minor, true);
  v.setUint32(8, o.maxReadahead, true);
  v.setUint32(12, o.flags >>> 0, true);
  v.setUint16(16, o.maxBackground, true);
  v.setUint16(18, o.congestionThreshold, true);
  v.setUint32(20, o.maxWrite, true);
  v.setUint32(24, 1, true); // time_gran: nanoseconds
  v.setUint16(28, o.maxPages, true);
  return b;
}

/**
 * The INIT reply for what the kernel offered: the smaller minor, the flags both sides have,
 * `maxWrite` bytes per WRITE (and READ, through max_pages). Throws for another major version.
 */
export function negotiateInit(init: InitIn, maxWrite: number): InitOut {
  if (init.major !== FUSE_MAJOR) throw new RangeError(`kernel speaks FUSE ${init.major}, not ${FUSE_MAJOR}`);
  const wanted = Init.ASYNC_READ | Init.BIG_WRITES | Init.ASYNC_DIO | Init.ABORT_ERROR | Init.MAX_PAGES;
  return {
    minor: Math.min(init.minor, FUSE_MINOR),
    maxReadahead: Math.min(init.maxReadahead, 128 * 1024),
    flags: init.flags & wanted,
    maxBackground: 64,
    congestionThreshold: 48,
    maxWrite,
    maxPages: Math.ceil(maxWrite / 4096),
  };
}

/** The attributes of one inode (struct fuse_attr). */
export interface Attr {
  ino: number;
  size: number;
  mode: number;
  nlink: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch, for atime, mtime and ctime alike. */
  time: number;
}

function writeAttr(v: DataView, at: number, a: Attr): void {
  v.setBigUint64(at, BigInt(a.ino), true);
  v.setBigUint64(at + 8, BigInt(a.size), true);
  v.setBigUint64(at + 16, BigInt(Math.ceil(a.size / 512)), true);
  for (const off of [24, 32, 40]) v.setBigUint64(at + off, BigInt(a.time), true);
  v.setUint32(at + 60, a.mode, true);
  v.setUint32(at + 64, a.nlink, true);
  v.setUint32(at + 68, a.uid, true);
  v.setUint32(at + 72, a.gid, true);
  v.setUint32(at + 80, 4096, true); // blksize
}

/** struct fuse_entry_out; cache timeouts of zero, so every lookup and stat asks the server. */
export function encodeEntryOut(nodeid: number, a: Attr): Uint8Array {
  const b = new Uint8Array(40 + ATTR_SIZE);
  const v = new DataView(b.buffer);
  v.setBigUint64(0, BigInt(nodeid), true);
  writeAttr(v, 40, a);
  return b;
}

/** struct fuse_attr_out with a zero cache timeout. */
export function encodeAttrOut(a: Attr): Uint8Array {
  const b = new Uint8Array(16 + ATTR_SIZE);
  writeAttr(new DataView(b.buffer), 16, a);
  return b;
}

/** struct fuse_open_out. */
export function encodeOpenOut(fh: number, openFlags: number): Uint8Array {
  const b = new Uint8Array(16);
  const v = new DataView(b.buffer);
  v.setBigUint64(0, BigInt(fh), true);
  v.setUint32(8, openFlags, true);
  return b;
}

/** struct fuse_write_out. */
export function encodeWriteOut(size: number): Uint8Array {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setUint32(0, size, true);
  return b;
}

/** struct fuse_statfs_out (struct fuse_kstatfs, 80 bytes). */
export function encodeStatfsOut(s: { blocks: number; files: number; bsize: number }): Uint8Array {
  const b = new Uint8Array(80);
  const v = new DataView(b.buffer);
  v.setBigUint64(0, BigInt(s.blocks), true);
  v.setBigUint64(24, BigInt(s.files), true);
  v.setUint32(40, s.bsize, true);
  v.setUint32(44, 255, true); // namelen
  v.setUint32(48, s.bsize, true); // frsize
  return b;
}

/** One directory entry for a READDIR reply. */
export interface Dirent {
  ino: number;
  name: string;
  type: number;
}

/**
 * A READDIR reply: the entries from index `from` on that fit in `maxBytes`, each struct
 * fuse_dirent padded to 8 bytes, its `off` the index of the next entry (the cookie the kernel
 * passes back as the next offset).
 */
export function encodeDirents(entries: readonly Dirent[], from: number, maxBytes: number): Uint8Array {
  const parts: Uint8Array[] = [];
  let total = 0;
  for (let i = from; i < entries.length; i++) {
    const e = entries[i] as Dirent;
    const name = new TextEncoder().encode(e.name);
    const size = (DIRENT_NAME_OFFSET + name.length + 7) & ~7;
    if (total + size > maxBytes) break;
    const b = new Uint8Array(size);
    const v = new DataView(b.buffer);
    v.setBigUint64(0, BigInt(e.ino), true);
    v.setBigUint64(8, BigInt(i + 1), true);
    v.setUint32(16, name.length, true);
    v.setUint32(20, e.type, true);
    b.set(name, DIRENT_NAME_OFFSET);
    parts.push(b);
    total += size;
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The NUL-terminated name at the start of a LOOKUP body. */
export function parseName(body: DataView): string {
  const bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  const end = bytes.indexOf(0);
  return new TextDecoder().decode(end < 0 ? bytes : bytes.subarray(0, end));
}
