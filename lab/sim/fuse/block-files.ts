// A userspace block device without a kernel module of our own: a FUSE mount, served by this Bun
// process, whose root directory holds one file per block device, each backed by a handler. losetup
// on such a file gives a real block device whose every read, write, flush and discard reaches the
// handler. A Worker thread reads /dev/fuse; requests are answered here on the main thread.
import { closeSync, type Dirent as FsDirent, openSync, readdirSync, realpathSync, writevSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import { LibcError } from "../spdk/libc.ts";
import type { ReaderEnd, ReaderStart } from "./dev-reader-worker.ts";
import {
  type Attr,
  type Dirent,
  DT_DIR,
  DT_REG,
  Errno,
  encodeAttrOut,
  encodeDirents,
  encodeEntryOut,
  encodeInitOut,
  encodeOpenOut,
  encodeStatfsOut,
  encodeWriteOut,
  FALLOC_FL_KEEP_SIZE,
  FALLOC_FL_PUNCH_HOLE,
  FALLOC_FL_ZERO_RANGE,
  FATTR_SIZE,
  FOPEN_DIRECT_IO,
  FUSE_ROOT_ID,
  IN_HEADER_SIZE,
  negotiateInit,
  Op,
  outHeader,
  parseInitIn,
  parseName,
  parseRequest,
  type Request,
  S_IFDIR,
  S_IFREG,
  u64,
  WRITE_IN_SIZE,
} from "./fuse-abi.ts";
import {
  abortFuseConnection,
  EBUSY,
  fuseConnectionId,
  MNT_DETACH,
  MS_NODEV,
  MS_NOSUID,
  mount,
  mountTable,
  umount2,
} from "./mount-syscalls.ts";

/** An error a handler throws to answer one request with a specific errno (positive Linux errno). */
export class BlockIoError extends Error {
  override readonly name = "BlockIoError";
  constructor(
    readonly errno: number,
    message?: string,
  ) {
    super(message ?? `block I/O failed with errno ${errno}`);
  }
}

/**
 * What serves one block file. Methods run on the thread that mounted, may take as long as they
 * need (other requests keep being served meanwhile) and may be called concurrently. Offsets and
 * lengths are multiples of 512 within size(): reads are widened to 512-byte sectors (and clamped
 * to the size) by the server, unaligned writes, discards and write-zeroes are refused with EINVAL
 * before they reach the handler. Rejecting with BlockIoError answers its errno; any other
 * rejection answers EIO. A loop device over the file hands the errno to its own user as the
 * block layer maps it (errno_to_blk_status): EIO, ENOSPC, ETIMEDOUT, ENOLINK, ENODEV and a few
 * more come through as themselves, the rest as EIO.
 */
export interface BlockFileHandler {
  /** Current size in bytes (a multiple of 512); read at every GETATTR/LOOKUP. */
  size(): number;
  /** Resolves with exactly `length` bytes. */
  read(offset: number, length: number): Promise<Uint8Array>;
  /** `data` belongs to the handler from the call on (it is not reused by the server). */
  write(offset: number, data: Uint8Array): Promise<void>;
  /** Block-layer flush (arrives as FSYNC). */
  flush(): Promise<void>;
  /** Discard (FALLOCATE with PUNCH_HOLE|KEEP_SIZE). */
  discard(offset: number, length: number): Promise<void>;
  /** Write zeroes (FALLOCATE with ZERO_RANGE). */
  writeZeroes(offset: number, length: number): Promise<void>;
}

export interface BlockFileServer {
  readonly mountpoint: string;
  /** The fusectl connection number (/sys/fs/fuse/connections/<id>). */
  readonly connectionId: number;
  /** Resolves once the kernel connection is gone (unmounted, aborted, closed) and the worker stopped reading. */
  readonly ended: Promise<void>;
  /**
   * Makes `name` appear in the mount, served by `h`. Throws if it exists, if the name is not a
   * plain file name (empty, ".", "..", a "/" or NUL, over 255 bytes) or after close().
   */
  add(name: string, h: BlockFileHandler): void;
  /**
   * Makes `name` disappear; later requests on open handles of it (a loop device over it) answer
   * EIO. Requests already with the handler complete. No-op for an unknown name.
   */
  remove(name: string): void;
  /** Names served now. */
  names(): string[];
  /**
   * Fails every pending and future request of the connection with an error (fusectl abort); for a
   * hung server. The mount stays (dead: "Transport endpoint is not connected") until close().
   * Idempotent; rejects only when fusectl cannot be used.
   */
  abort(): Promise<void>;
  /**
   * Unmounts (lazy if busy) and stops the worker. A busy mount (a loop device or an open file on
   * it) is detached and its connection aborted, so its remaining users get errors instead of
   * waiting forever. Handler calls still running finish, their answers are dropped. Idempotent.
   */
  close(): Promise<void>;
}

export interface MountBlockFilesOptions {
  /** An existing empty directory. */
  mountpoint: string;
  logger?: Logger;
  /** Largest READ/WRITE the kernel sends, bytes; rounded to pages, 4 KiB..1 MiB. Default 1 MiB. */
  maxWrite?: number;
  /** How long to wait for the kernel's INIT after mounting. Default 10 s. */
  initTimeoutMs?: number;
  /**
   * What to do with a block-files mount already on `mountpoint` (one a crashed server left,
   * "Transport endpoint is not connected"): false (default) rejects; true aborts its connection
   * and detaches it first, so its remaining users fail instead of waiting.
   */
  replaceStale?: boolean;
}

const FSTYPE = "fuse.distort-block";

interface Node {
  id: number;
  name: string;
  handler: BlockFileHandler;
  removed: boolean;
  /** Lookups the kernel holds (FORGET gives them back); a removed node is dropped at zero. */
  lookups: number;
}

const MAX_WRITE_LIMIT = 1 << 20;
const STOP_TIMEOUT_MS = 5_000;

function validName(name: string): boolean {
  return (
    name !== "" &&
    name !== "." &&
    name !== ".." &&
    !name.includes("/") &&
    !name.includes("\0") &&
    Buffer.byteLength(name) <= 255
  );
}

function errnoOf(err: unknown): number {
  if (err instanceof BlockIoError && Number.isInteger(err.errno) && err.errno > 0 && err.errno < 4096) {
    return err.errno;
  }
  return Errno.EIO;
}

const aligned = (n: number) => n % 512 === 0;

/**
 * Mounts a FUSE file system on `mountpoint` (needs CAP_SYS_ADMIN and /dev/fuse) and resolves once
 * the kernel completed INIT, so files added afterwards can be opened at once. Rejects (and leaves
 * nothing mounted) when /dev/fuse, mount(2) or INIT fails. The server answers from this thread:
 * it must never touch the mount with a synchronous call (statSync, spawnSync of a program using
 * it), which would wait for an answer only this thread can give.
 */
export async function mountBlockFiles(opts: MountBlockFilesOptions): Promise<BlockFileServer> {
  // Resolve the parent only: the mount point itself may be a dead or hung mount, which a stat would
  // fail on or wait on.
  const mountpoint = join(realpathSync(dirname(opts.mountpoint)), basename(opts.mountpoint));
  const log = (opts.logger ?? silentLogger).with({ component: "fuse-block-files", mountpoint });
  const stale = mountTable().filter((m) => m.mountpoint === mountpoint && m.fstype === FSTYPE);
  if (stale.length > 0) {
    if (!opts.replaceStale) throw new Error(`${mountpoint} already has a block-files mount on it`);
    for (let i = 0; i < stale.length; i++) {
      const id = fuseConnectionId(mountpoint);
      if (id !== undefined) {
        try {
          abortFuseConnection(id);
        } catch (err) {
          log.debug("stale connection not aborted", { error: (err as Error).message });
        }
      }
      umount2(mountpoint, MNT_DETACH);
    }
    log.info("replaced a stale block-files mount", { mounts: stale.length });
  }
  const maxWrite =
    Math.max(4096, Math.min(MAX_WRITE_LIMIT, Math.ceil((opts.maxWrite ?? MAX_WRITE_LIMIT) / 4096) * 4096)) |
    0;
  const fd = openSync("/dev/fuse", "r+");
  const server = new FuseBlockServer(mountpoint, fd, maxWrite, log);
  try {
    mount(
      "distort-block",
      mountpoint,
      FSTYPE,
      MS_NOSUID | MS_NODEV,
      `fd=${fd},rootmode=40000,user_id=${process.getuid?.() ?? 0},group_id=${process.getgid?.() ?? 0},allow_other`,
    );
  } catch (err) {
    server.discard();
    closeSync(fd);
    throw err;
  }
  try {
    server.start(fuseConnectionId(mountpoint));
    await server.initialised(opts.initTimeoutMs ?? 10_000);
  } catch (err) {
    await server.close();
    throw err;
  }
  log.debug("mounted", { connection: server.connectionId, maxWrite });
  return server;
}

class FuseBlockServer implements BlockFileServer {
  readonly mountpoint: string;
  readonly ended: Promise<void>;
  #connectionId = -1;
  readonly #fd: number;
  readonly #maxWrite: number;
  readonly #log: Logger;
  readonly #worker: Worker;
  readonly #byName = new Map<string, Node>();
  readonly #byId = new Map<number, Node>();
  #nextId = FUSE_ROOT_ID + 1;
  #nextFh = 1;
  /** Set once answers must no longer be written (aborted, closing: the fd may be closed and reused). */
  #mute = false;
  #ended = false;
  #endedResolve!: () => void;
  #closing: Promise<void> | undefined;
  #aborting: Promise<void> | undefined;
  #init: { resolve: () => void; reject: (e: Error) => void } | undefined;
  #initDone = false;
  readonly #mountTime = Math.floor(Date.now() / 1000);

  constructor(mountpoint: string, fd: number, maxWrite: number, log: Logger) {
    this.mountpoint = mountpoint;
    this.#fd = fd;
    this.#maxWrite = maxWrite;
    this.#log = log;
    this.ended = new Promise<void>((r) => {
      this.#endedResolve = r;
    });
    this.#worker = new Worker(readerWorkerUrl());
    this.#worker.onmessage = (e: MessageEvent<ArrayBuffer | ReaderEnd>) => {
      if (e.data instanceof ArrayBuffer) this.#onRequest(e.data);
      else this.#onEnd(e.data.end);
    };
    this.#worker.onerror = (e) => {
      this.#log.error("FUSE reader thread failed", { error: e.message });
      this.#onEnd("worker error");
    };
  }

  get connectionId(): number {
    return this.#connectionId;
  }

  /** Starts reading /dev/fuse once it is mounted (before, a read fails at once). */
  start(id: number | undefined): void {
    // One request of max_write bytes plus its headers must fit (the kernel refuses smaller reads).
    this.#worker.postMessage({ fd: this.#fd, bufferSize: this.#maxWrite + 4096 } satisfies ReaderStart);
    if (id === undefined) throw new Error(`no FUSE mount on ${this.mountpoint} after mount(2)`);
    this.#connectionId = id;
  }

  /** Drops a server whose mount failed (its worker never started reading). */
  discard(): void {
    this.#worker.terminate();
    this.#onEnd("not mounted");
  }

  initialised(timeoutMs: number): Promise<void> {
    if (this.#initDone) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no FUSE INIT within ${timeoutMs} ms`)), timeoutMs);
      this.#init = {
        resolve: () => {
          clearTimeout(t);
          resolve();
        },
        reject: (e) => {
          clearTimeout(t);
          reject(e);
        },
      };
    });
  }

  add(name: string, h: BlockFileHandler): void {
    if (this.#closing || this.#ended) throw new Error(`${this.mountpoint} is closed`);
    if (!validName(name)) throw new Error(`"${name}" is not a file name`);
    if (this.#byName.has(name)) throw new Error(`${name} already exists in ${this.mountpoint}`);
    const node: Node = { id: this.#nextId++, name, handler: h, removed: false, lookups: 0 };
    this.#byName.set(name, node);
    this.#byId.set(node.id, node);
  }

  remove(name: string): void {
    const node = this.#byName.get(name);
    if (!node) return;
    this.#byName.delete(name);
    node.removed = true;
    if (node.lookups <= 0) this.#byId.delete(node.id);
  }

  names(): string[] {
    return [...this.#byName.keys()];
  }

  abort(): Promise<void> {
    if (this.#ended) return Promise.resolve();
    this.#aborting ??= (async () => {
      this.#mute = true;
      abortFuseConnection(this.#connectionId);
      await this.#waitEnded(STOP_TIMEOUT_MS);
    })();
    return this.#aborting;
  }

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#mute = true;
    if (this.#connectionId >= 0) {
      let busy = false;
      try {
        umount2(this.mountpoint, 0);
      } catch (err) {
        if (err instanceof LibcError && err.errno === EBUSY) busy = true;
        else this.#log.debug("umount", { error: (err as Error).message });
      }
      if (busy) {
        try {
          umount2(this.mountpoint, MNT_DETACH);
        } catch (err) {
          this.#log.warn("lazy umount failed", { error: (err as Error).message });
        }
      }
      // A busy mount, or a copy of the mount in another mount namespace, keeps the connection up:
      // abort it, or its users would wait forever on a server that no longer reads.
      if (!(await this.#waitEnded(busy ? 0 : 1_000))) {
        try {
          abortFuseConnection(this.#connectionId);
        } catch (err) {
          this.#log.warn("cannot abort the FUSE connection", { error: (err as Error).message });
        }
      }
    }
    await this.stopWorker();
    closeSync(this.#fd);
  }

  /** Waits for the reader to end (bounded), then terminates it. */
  async stopWorker(): Promise<void> {
    if (!(await this.#waitEnded(STOP_TIMEOUT_MS))) {
      this.#log.warn("FUSE reader thread still blocked; terminating it");
    }
    this.#worker.terminate();
    this.#onEnd("stopped");
  }

  async #waitEnded(ms: number): Promise<boolean> {
    if (this.#ended) return true;
    if (ms <= 0) return false;
    let t: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<boolean>((r) => {
      t = setTimeout(() => r(false), ms);
    });
    const ok = await Promise.race([this.ended.then(() => true), timeout]);
    clearTimeout(t);
    return ok;
  }

  #onEnd(reason: string): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#mute = true;
    this.#log.debug("FUSE connection ended", { reason });
    this.#init?.reject(new Error(`FUSE connection ended before INIT (${reason})`));
    this.#endedResolve();
  }

  // ---- requests ----

  #reply(req: Request, errno: number, ...payload: Uint8Array[]): undefined {
    if (this.#mute) return;
    const len = errno === 0 ? payload.reduce((n, p) => n + p.length, 0) : 0;
    try {
      writevSync(
        this.#fd,
        errno === 0 ? [outHeader(req.unique, 0, len), ...payload] : [outHeader(req.unique, errno, 0)],
      );
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // ENOENT: the kernel no longer waits for this request (interrupted or aborted).
      if (code !== "ENOENT" && code !== "ENODEV") {
        this.#log.warn("cannot answer a FUSE request", { opcode: req.opcode, error: (err as Error).message });
      }
    }
    return undefined;
  }

  #onRequest(buf: ArrayBuffer): void {
    let req: Request;
    try {
      req = parseRequest(buf);
    } catch (err) {
      this.#log.error("malformed FUSE request", { error: (err as Error).message });
      return;
    }
    try {
      const pending = this.#dispatch(req);
      if (pending) {
        pending.then(
          () => {},
          (err: unknown) => this.#failed(req, err),
        );
      }
    } catch (err) {
      this.#failed(req, err);
    }
  }

  #failed(req: Request, err: unknown): void {
    const errno = errnoOf(err);
    if (!(err instanceof BlockIoError)) {
      this.#log.warn("block file request failed", {
        opcode: req.opcode,
        error: (err as Error)?.message ?? String(err),
      });
    }
    this.#reply(req, errno);
  }

  /** A live file node, or undefined after answering the request with the right error. */
  #file(req: Request): Node | undefined {
    if (req.nodeid === FUSE_ROOT_ID) {
      this.#reply(req, Errno.EISDIR);
      return undefined;
    }
    const node = this.#byId.get(req.nodeid);
    if (!node || node.removed) {
      // EIO, as I/O to a namespace that went away fails on Linux (ENODEV would reach a loop
      // device's user as "No such device": the block layer passes it through as BLK_STS_OFFLINE).
      this.#reply(req, Errno.EIO);
      return undefined;
    }
    return node;
  }

  #rootAttr(): Attr {
    return {
      ino: FUSE_ROOT_ID,
      size: 0,
      mode: S_IFDIR | 0o755,
      nlink: 2,
      uid: 0,
      gid: 0,
      time: this.#mountTime,
    };
  }

  #fileAttr(node: Node): Attr {
    return {
      ino: node.id,
      size: node.handler.size(),
      mode: S_IFREG | 0o600,
      nlink: 1,
      uid: 0,
      gid: 0,
      time: this.#mountTime,
    };
  }

  /** Answers `req`; returns a promise for requests that wait on a handler. */
  #dispatch(req: Request): Promise<void> | undefined {
    const b = req.body;
    switch (req.opcode) {
      case Op.INIT:
        return this.#onInit(req);
      case Op.DESTROY:
        this.#reply(req, 0);
        return;
      case Op.LOOKUP: {
        if (req.nodeid !== FUSE_ROOT_ID) return this.#reply(req, Errno.ENOTDIR);
        const node = this.#byName.get(parseName(b));
        if (!node) return this.#reply(req, Errno.ENOENT);
        const attr = this.#fileAttr(node);
        node.lookups++;
        return this.#reply(req, 0, encodeEntryOut(node.id, attr));
      }
      case Op.FORGET:
        this.#forget(req.nodeid, u64(b, 0));
        return;
      case Op.BATCH_FORGET: {
        const count = b.getUint32(0, true);
        for (let i = 0; i < count && 8 + i * 16 + 16 <= b.byteLength; i++) {
          this.#forget(u64(b, 8 + i * 16), u64(b, 16 + i * 16));
        }
        return;
      }
      case Op.GETATTR: {
        if (req.nodeid === FUSE_ROOT_ID) return this.#reply(req, 0, encodeAttrOut(this.#rootAttr()));
        const node = this.#file(req);
        if (node) this.#reply(req, 0, encodeAttrOut(this.#fileAttr(node)));
        return;
      }
      case Op.SETATTR:
        return this.#onSetattr(req);
      case Op.OPEN: {
        const node = this.#file(req);
        if (node) this.#reply(req, 0, encodeOpenOut(this.#nextFh++, FOPEN_DIRECT_IO));
        return;
      }
      case Op.OPENDIR:
        if (req.nodeid !== FUSE_ROOT_ID) return this.#reply(req, Errno.ENOTDIR);
        return this.#reply(req, 0, encodeOpenOut(0, 0));
      case Op.READDIR: {
        if (req.nodeid !== FUSE_ROOT_ID) return this.#reply(req, Errno.ENOTDIR);
        const entries: Dirent[] = [
          { ino: FUSE_ROOT_ID, name: ".", type: DT_DIR },
          { ino: FUSE_ROOT_ID, name: "..", type: DT_DIR },
          ...[...this.#byName.values()].map((n) => ({ ino: n.id, name: n.name, type: DT_REG })),
        ];
        return this.#reply(req, 0, encodeDirents(entries, u64(b, 8), b.getUint32(16, true)));
      }
      case Op.READ:
        return this.#onRead(req);
      case Op.WRITE:
        return this.#onWrite(req);
      case Op.FSYNC: {
        const node = this.#file(req);
        if (!node) return;
        return node.handler.flush().then(() => this.#reply(req, 0));
      }
      case Op.FALLOCATE:
        return this.#onFallocate(req);
      case Op.STATFS: {
        let bytes = 0;
        for (const n of this.#byName.values()) bytes += n.handler.size();
        return this.#reply(
          req,
          0,
          encodeStatfsOut({ blocks: Math.floor(bytes / 4096), files: this.#byName.size, bsize: 4096 }),
        );
      }
      case Op.FLUSH: // close(2) of a descriptor: nothing buffered here (FSYNC is the block flush)
      case Op.RELEASE:
      case Op.RELEASEDIR:
      case Op.FSYNCDIR:
        return this.#reply(req, 0);
      case Op.INTERRUPT: // handlers cannot be cancelled; the request is answered when it completes
        return;
      case Op.CREATE:
      case Op.MKNOD:
      case Op.MKDIR:
      case Op.SYMLINK:
      case Op.LINK:
      case Op.UNLINK:
      case Op.RMDIR:
      case Op.RENAME:
      case Op.RENAME2:
        return this.#reply(req, Errno.EPERM); // the directory is the server's to change
      default: // GETXATTR, LISTXATTR, SETXATTR, ACCESS, IOCTL, LSEEK, POLL, ...: the kernel stops asking
        return this.#reply(req, Errno.ENOSYS);
    }
  }

  #forget(nodeid: number, nlookup: number): void {
    const node = this.#byId.get(nodeid);
    if (!node) return;
    node.lookups -= nlookup;
    if (node.removed && node.lookups <= 0) this.#byId.delete(nodeid);
  }

  #onInit(req: Request): undefined {
    try {
      const out = negotiateInit(parseInitIn(req.body), this.#maxWrite);
      this.#log.debug("FUSE INIT", { kernel: parseInitIn(req.body), reply: out });
      this.#reply(req, 0, encodeInitOut(out));
      this.#initDone = true;
      this.#init?.resolve();
    } catch (err) {
      this.#reply(req, Errno.EPROTO);
      this.#init?.reject(err as Error);
    }
    return undefined;
  }

  #onSetattr(req: Request): undefined {
    const b = req.body;
    if (req.nodeid === FUSE_ROOT_ID) {
      this.#reply(req, 0, encodeAttrOut(this.#rootAttr()));
      return;
    }
    const node = this.#file(req);
    if (!node) return;
    // A block device's size is the target's to change: refuse truncation, ignore mode, owner, times.
    if (b.getUint32(0, true) & FATTR_SIZE && u64(b, 16) !== node.handler.size()) {
      this.#reply(req, Errno.EPERM);
      return;
    }
    this.#reply(req, 0, encodeAttrOut(this.#fileAttr(node)));
  }

  async #onRead(req: Request): Promise<void> {
    const node = this.#file(req);
    if (!node) return;
    const b = req.body;
    const offset = u64(b, 8);
    const length = b.getUint32(16, true);
    const size = node.handler.size();
    if (offset >= size || length === 0) return this.#reply(req, 0);
    const end = Math.min(offset + length, size);
    const start = offset - (offset % 512);
    const stop = Math.min(Math.ceil(end / 512) * 512, size);
    const data = await node.handler.read(start, stop - start);
    if (data.length !== stop - start) {
      throw new Error(`handler of ${node.name} returned ${data.length} bytes for a read of ${stop - start}`);
    }
    this.#reply(req, 0, data.subarray(offset - start, end - start));
  }

  async #onWrite(req: Request): Promise<void> {
    const node = this.#file(req);
    if (!node) return;
    const b = req.body;
    const offset = u64(b, 8);
    const length = b.getUint32(16, true);
    if (b.byteLength < WRITE_IN_SIZE + length) return this.#reply(req, Errno.EINVAL);
    if (!aligned(offset) || !aligned(length)) return this.#reply(req, Errno.EINVAL);
    if (offset + length > node.handler.size()) return this.#reply(req, Errno.ENOSPC);
    const data = new Uint8Array(b.buffer, IN_HEADER_SIZE + WRITE_IN_SIZE, length);
    await node.handler.write(offset, data);
    this.#reply(req, 0, encodeWriteOut(length));
  }

  async #onFallocate(req: Request): Promise<void> {
    const node = this.#file(req);
    if (!node) return;
    const b = req.body;
    const offset = u64(b, 8);
    const length = u64(b, 16);
    const mode = b.getUint32(24, true);
    const size = node.handler.size();
    if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
      return this.#reply(req, Errno.EOPNOTSUPP);
    }
    const keepSize = (mode & FALLOC_FL_KEEP_SIZE) !== 0;
    // Growing the file is the target's business, whatever the mode.
    if (!keepSize && offset + length > size) return this.#reply(req, Errno.ENOSPC);
    const end = Math.min(offset + length, size);
    if (offset >= end) return this.#reply(req, 0);
    if ((mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) === 0) {
      // Plain allocation keeps the data: every block of a block device is allocated already.
      return this.#reply(req, 0);
    }
    if (!aligned(offset) || !aligned(end)) return this.#reply(req, Errno.EINVAL);
    if (mode & FALLOC_FL_PUNCH_HOLE) {
      if (!keepSize) return this.#reply(req, Errno.EOPNOTSUPP); // the kernel requires KEEP_SIZE with it
      await node.handler.discard(offset, end - offset);
    } else {
      await node.handler.writeZeroes(offset, end - offset);
    }
    this.#reply(req, 0);
  }
}

const READER_WORKER = "dev-reader-worker";

/**
 * Where the reader thread's script is. From sources, beside this file. In a standalone executable
 * (`bun build --compile` with the worker as a further entry point, lab/cluster/image-plan.ts) every
 * module's URL is the executable's, and the worker lies in the embedded file system under its path
 * relative to the entry points' common directory (which depends on the binary) and with a .js
 * extension once minified: found by name there.
 */
export function readerWorkerUrl(): string {
  const here = new URL(`./${READER_WORKER}.ts`, import.meta.url);
  if (!here.pathname.startsWith("/$bunfs/")) return here.href;
  const found = findFile("/$bunfs/root", [`${READER_WORKER}.js`, `${READER_WORKER}.ts`], 4);
  if (!found) {
    throw new Error(`${READER_WORKER}.ts is not in this executable: compile it in as an entry point`);
  }
  return found;
}

function findFile(dir: string, names: readonly string[], depth: number): string | undefined {
  let entries: FsDirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return undefined;
  }
  for (const e of entries) if (names.includes(e.name) && !e.isDirectory()) return `${dir}/${e.name}`;
  if (depth === 0) return undefined;
  for (const e of entries) {
    if (!e.isDirectory()) continue;
    const found = findFile(`${dir}/${e.name}`, names, depth - 1);
    if (found) return found;
  }
  return undefined;
}
