// AIO filesystem devices (fsdev_aio_create/delete): a named export of a host directory, the
// building block DPF's filesystem plugin hands to virtio-fs. Runtime state only.
import { statSync } from "node:fs";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** One fsdev. */
export interface Fsdev {
  readonly name: string;
  readonly rootPath: string;
  readonly xattrEnabled: boolean;
  readonly writebackCacheEnabled: boolean;
  readonly maxWrite: number;
  readonly skipRw: boolean;
}

/** The fsdev registry of one app. */
export class Fsdevs {
  readonly #all: Fsdev[] = [];

  list(): readonly Fsdev[] {
    return this.#all;
  }

  /**
   * Registers an fsdev over directory `rootPath`. EEXIST for a taken name; ENOENT or ENOTDIR when
   * the root cannot be opened as a directory.
   */
  create(fsdev: Fsdev): void {
    if (this.#all.some((f) => f.name === fsdev.name)) throw new ErrnoError(Errno.EEXIST, fsdev.name);
    let dir: boolean;
    try {
      dir = statSync(fsdev.rootPath).isDirectory();
    } catch {
      throw new ErrnoError(Errno.ENOENT, fsdev.rootPath);
    }
    if (!dir) throw new ErrnoError(Errno.ENOTDIR, fsdev.rootPath);
    this.#all.push(fsdev);
  }

  /** ENODEV when there is no fsdev of that name. */
  delete(name: string): void {
    const at = this.#all.findIndex((f) => f.name === name);
    if (at < 0) throw new ErrnoError(Errno.ENODEV, name);
    this.#all.splice(at, 1);
  }
}
