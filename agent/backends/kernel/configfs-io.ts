// Careful configfs access for the kernel target over a HostFs: attribute values read back the way
// nvmet shows them, symlink targets resolved whichever form they are stored in (configfs answers
// readlink with a relative path), idempotent mkdir/rmdir/unlink, and errno mapped to StorageError.
import { dirname, posix, resolve } from "node:path";
import { type ErrorKind, StorageError } from "../../../lib/errors.ts";
import type { HostFs } from "../../../lib/fs.ts";

/** The errno code ("ENOENT", "EBUSY", ...) carried by a node:fs style error, if any. */
export function errnoOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

const KIND_BY_ERRNO: Record<string, ErrorKind> = {
  ENOENT: "not-found",
  EBUSY: "busy",
  EEXIST: "already-exists",
  // The device or address is not there (yet): a later retry may find it.
  ENXIO: "unavailable",
  ENODEV: "unavailable",
  ENOTBLK: "unavailable",
  EADDRNOTAVAIL: "unavailable",
  EADDRINUSE: "precondition",
};

/** Wraps a failed configfs operation; the errno code leads the message because it is the diagnosis. */
export function configfsError(op: string, path: string, err: unknown, kind?: ErrorKind): StorageError {
  const code = errnoOf(err) ?? "error";
  const msg = err instanceof Error ? err.message : String(err);
  return new StorageError(
    kind ?? KIND_BY_ERRNO[code] ?? "internal",
    `configfs ${op} ${path} failed: ${code} (${msg})`,
    {
      cause: err,
      details: { op, path, errno: code },
    },
  );
}

/**
 * Thin, stateless helpers over one HostFs. Every method either does exactly what it says or throws
 * a StorageError from configfsError; "IfMissing"/"IfPresent" variants are idempotent. No locking:
 * callers serialise (KernelTarget holds its mutex around every sequence).
 */
export class ConfigfsIo {
  readonly fs: HostFs;
  readonly #root: string;

  constructor(fs: HostFs) {
    this.fs = fs;
    this.#root = resolve(fs.root);
  }

  /**
   * An attribute's value without the trailing newline and the space padding nvmet adds (attr_serial
   * is padded to 20 bytes); undefined when the file does not exist.
   */
  async readAttr(path: string): Promise<string | undefined> {
    try {
      return (await this.fs.readFile(path)).trimEnd();
    } catch (err) {
      if (errnoOf(err) === "ENOENT") return undefined;
      throw configfsError("read", path, err);
    }
  }

  /**
   * Writes one attribute value in a single write, as configfs requires. A failure names the
   * attribute and errno but never the value: some attributes hold secrets (dhchap_key).
   */
  async write(path: string, value: string): Promise<void> {
    try {
      await this.fs.writeFile(path, value);
    } catch (err) {
      throw configfsError("write", path, err);
    }
  }

  /**
   * Writes and reads back: the kernel may accept a write and keep something else (a truncated or
   * reformatted value), and an unverified export is not an export. The mismatch error gives
   * lengths, never the values, for the same reason as write().
   */
  async writeVerified(path: string, value: string): Promise<void> {
    await this.write(path, value);
    const got = await this.readAttr(path);
    if (got !== value) {
      throw new StorageError(
        "internal",
        `configfs ${path}: the value read back differs from the one written (${value.length} bytes written, ${got === undefined ? "nothing" : `${got.length} bytes`} read)`,
        {
          details: { path, wroteBytes: value.length, readBytes: got?.length },
        },
      );
    }
  }

  async isDir(path: string): Promise<boolean> {
    return this.fs.isDirectory(path);
  }

  /** Creates a directory unless one exists; true when it created it. */
  async mkdirIfMissing(path: string): Promise<boolean> {
    if (await this.fs.isDirectory(path)) return false;
    try {
      await this.fs.mkdir(path);
      return true;
    } catch (err) {
      // Someone outside this process made it in the meantime: the goal is met.
      if (errnoOf(err) === "EEXIST" && (await this.fs.isDirectory(path))) return false;
      throw configfsError("mkdir", path, err);
    }
  }

  /** Removes a directory if it exists; true when it removed it. */
  async rmdirIfPresent(path: string): Promise<boolean> {
    try {
      await this.fs.rmdir(path);
      return true;
    } catch (err) {
      if (errnoOf(err) === "ENOENT") return false;
      throw configfsError("rmdir", path, err);
    }
  }

  /** Removes a symlink if it exists; true when it removed it. */
  async unlinkIfPresent(path: string): Promise<boolean> {
    try {
      await this.fs.unlink(path);
      return true;
    } catch (err) {
      if (errnoOf(err) === "ENOENT") return false;
      throw configfsError("unlink", path, err);
    }
  }

  async symlink(target: string, path: string): Promise<void> {
    try {
      await this.fs.symlink(target, path);
    } catch (err) {
      throw configfsError(`symlink to ${target} at`, path, err);
    }
  }

  /** Directory entries, sorted; [] when the directory does not exist. */
  async list(path: string): Promise<string[]> {
    try {
      return (await this.fs.readdir(path)).sort();
    } catch (err) {
      if (errnoOf(err) === "ENOENT") return [];
      throw configfsError("readdir", path, err);
    }
  }

  /**
   * The absolute host path a symlink points to, whether it is stored relative (configfs answers
   * "../../../../nvmet/subsystems/<nqn>") or absolute (under the HostFs root in a test tree).
   * undefined when nothing is there; "" when something is there that is not a symlink.
   */
  async linkTarget(path: string): Promise<string | undefined> {
    let target: string;
    try {
      target = await this.fs.readlink(path);
    } catch (err) {
      const code = errnoOf(err);
      if (code === "ENOENT") return undefined;
      if (code === "EINVAL") return "";
      throw configfsError("readlink", path, err);
    }
    if (!target.startsWith("/")) return posix.resolve(dirname(path), target);
    if (this.#root !== "/" && (target === this.#root || target.startsWith(`${this.#root}/`))) {
      return posix.normalize(`/${target.slice(this.#root.length)}`);
    }
    return posix.normalize(target);
  }
}
