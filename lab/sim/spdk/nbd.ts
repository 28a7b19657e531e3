// SPDK's NBD export (lib/nbd) without an NBD kernel module: each exported bdev is one file of a
// FUSE block-files mount served from the bdev's own I/O, and a loop device over that file is the
// kernel block device. nbd_start_disk therefore answers "/dev/loopN" where SPDK answers "/dev/nbdN".
import { mkdirSync } from "node:fs";
import { errorMessage } from "../../../lib/errors.ts";
import { type Exec, runChecked } from "../../../lib/exec.ts";
import { detachArgv, parseAttached } from "../../../lib/host/losetup.ts";
import type { Logger } from "../../../lib/log.ts";
import {
  type BlockFileHandler,
  type BlockFileServer,
  BlockIoError,
  mountBlockFiles,
} from "../fuse/block-files.ts";
import { detachLoopsUnder } from "../fuse/leftover-loops.ts";
import type { Bdev, BdevRegistry } from "./bdev.ts";
import { zeroRange } from "./block-io.ts";
import { Errno, ErrnoError, errnoOf } from "./rpc-error.ts";

/** One exported bdev, as nbd_get_disks lists it. */
export interface NbdDisk {
  readonly bdevName: string;
  /** The kernel device ("/dev/loopN"). */
  readonly device: string;
}

interface Export extends NbdDisk {
  readonly bdev: Bdev;
  /** The file's name in the mount. */
  readonly file: string;
}

export interface NbdExportsOptions {
  /** An existing or creatable directory to mount the block files on; owned by this app. */
  readonly mountpoint: string;
  readonly registry: BdevRegistry;
  /** Runs losetup. */
  readonly exec: Exec;
  readonly logger: Logger;
  /** Deadline of each losetup. Default 30 s. */
  readonly timeoutMs?: number;
}

/**
 * The NBD disks of one app. Like SPDK, an export opens the bdev for writing without claiming it
 * (spdk_bdev_open_ext): a bdev may be exported more than once, and its deletion hot-removes it,
 * which stops its disks first (nbd_bdev_hot_remove). Not safe for concurrent start/stop of the
 * same device: the RPC methods run them one at a time per request, each awaited to the end.
 */
export class NbdExports {
  readonly #opts: NbdExportsOptions;
  readonly #files: BlockFileServer;
  readonly #exports: Export[] = [];
  #next = 0;
  #closed = false;

  private constructor(opts: NbdExportsOptions, files: BlockFileServer) {
    this.#opts = opts;
    this.#files = files;
    opts.registry.addRemovalHook(async (bdev) => {
      for (const e of this.#exports.filter((x) => x.bdev === bdev)) {
        opts.logger.info("nbd disk stopped: its bdev is being removed", {
          bdev: e.bdevName,
          device: e.device,
        });
        await this.#teardown(e);
      }
    });
  }

  /**
   * Mounts the block files on `opts.mountpoint` after clearing what a killed predecessor left
   * there (its loop devices detached, its dead mount aborted and detached). Rejects when the
   * mount fails (no /dev/fuse, not root).
   */
  static async open(opts: NbdExportsOptions): Promise<NbdExports> {
    mkdirSync(opts.mountpoint, { recursive: true });
    await detachLoopsUnder(opts.exec, opts.mountpoint, opts.logger, opts.timeoutMs);
    const files = await mountBlockFiles({
      mountpoint: opts.mountpoint,
      logger: opts.logger,
      replaceStale: true,
    });
    return new NbdExports(opts, files);
  }

  get mountpoint(): string {
    return this.#files.mountpoint;
  }

  /** The exports in start order. */
  list(): readonly NbdDisk[] {
    return this.#exports.map((e) => ({ bdevName: e.bdevName, device: e.device }));
  }

  find(device: string): NbdDisk | undefined {
    const e = this.#exports.find((x) => x.device === device);
    return e && { bdevName: e.bdevName, device: e.device };
  }

  /**
   * Exports `bdev` and resolves with its kernel device, ready for I/O. Rejects with ErrnoError
   * (ENODEV after close, or the errno of a failed losetup as EIO), leaving nothing behind.
   */
  async start(bdev: Bdev): Promise<string> {
    if (this.#closed) throw new ErrnoError(Errno.ENODEV, "the nbd exports are closed");
    const file = `nbd${this.#next++}`;
    this.#files.add(file, handlerOf(bdev));
    let device: string | undefined;
    try {
      // --direct-io=on: the loop driver sends asynchronous direct I/O to the FUSE file, several
      // requests in flight, as the NBD driver keeps a queue of requests on SPDK's socket.
      device = parseAttached(
        await this.#run([
          "losetup",
          "--find",
          "--show",
          "--direct-io=on",
          `${this.#files.mountpoint}/${file}`,
        ]),
      );
      // A loop device is reused, and BLKROSET outlives its detach; an NBD disk starts writable.
      await this.#run(["blockdev", "--setrw", device]);
    } catch (err) {
      if (device) await this.#run(detachArgv(device)).catch(() => {});
      this.#files.remove(file);
      throw new ErrnoError(Errno.EIO, `exporting ${bdev.name}: ${errorMessage(err)}`);
    }
    if (this.#closed || !this.#opts.registry.list().includes(bdev)) {
      // Closed or hot-removed while losetup ran: undo, as the removal hook could not see it.
      await this.#run(detachArgv(device)).catch(() => {});
      this.#files.remove(file);
      throw new ErrnoError(Errno.ENODEV, `${bdev.name} went away while being exported`);
    }
    this.#exports.push({ bdev, bdevName: bdev.name, device, file });
    return device;
  }

  /** Stops the export on `device` (loop device detached, file removed); false when unknown. */
  async stop(device: string): Promise<boolean> {
    const e = this.#exports.find((x) => x.device === device);
    if (!e) return false;
    await this.#teardown(e);
    return true;
  }

  /** Stops every export and unmounts. Idempotent; never rejects. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const e of [...this.#exports]) await this.#teardown(e);
    await this.#files.close();
  }

  async #teardown(e: Export): Promise<void> {
    const at = this.#exports.indexOf(e);
    if (at < 0) return;
    this.#exports.splice(at, 1);
    // Detach first: a loop device still open (mounted) is detached by the kernel at last close
    // (autoclear), and removing the file then fails its remaining I/O, like an NBD disconnect.
    await this.#run(detachArgv(e.device)).catch((err) =>
      this.#opts.logger.warn("loop device not detached", { device: e.device, err: errorMessage(err) }),
    );
    this.#files.remove(e.file);
  }

  #run(argv: string[]): Promise<string> {
    return runChecked(this.#opts.exec, argv, { timeoutMs: this.#opts.timeoutMs ?? 30_000 });
  }
}

/** The FUSE file's side of an export: every request is I/O on the bdev (over the fabric for an NVMe bdev). */
function handlerOf(bdev: Bdev): BlockFileHandler {
  const io = bdev.io;
  const fail = (err: unknown): never => {
    throw new BlockIoError(errnoOf(err), errorMessage(err));
  };
  return {
    // Whole blocks only, as the NBD driver is told the bdev's block count.
    size: () => Math.floor(io.sizeBytes / bdev.blockSize) * bdev.blockSize,
    read: (offset, length) => io.read(offset, length).catch(fail),
    write: (offset, data) => io.write(offset, data).catch(fail),
    // The emulated bdevs keep no volatile cache: a flush has nothing to write back.
    flush: async () => {},
    discard: (offset, length) => zeroRange(io, offset, length).catch(fail),
    writeZeroes: (offset, length) => zeroRange(io, offset, length).catch(fail),
  };
}
