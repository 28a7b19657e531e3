// The keyring of one app with its file module: named keys backed by key files that must be
// absolute, private (no group/other bits) and owned by the emulator's user, as SPDK insists.
import { statSync } from "node:fs";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** A registered key. `refs` counts users besides the keyring itself (hosts, controllers). */
export interface Key {
  readonly name: string;
  readonly path: string;
  refs: number;
}

/** Runtime key store; a crash empties it. */
export class Keyring {
  readonly #keys: Key[] = [];

  list(): readonly Key[] {
    return this.#keys;
  }

  get(name: string): Key | undefined {
    return this.#keys.find((k) => k.name === name);
  }

  /**
   * keyring_file_add_key: EEXIST for a taken name, EINVAL for a name with ':' (reserved for
   * module prefixes), EPERM for a relative path or a file with group/other permissions or
   * another owner, the stat() errno (ENOENT...) when the file cannot be checked.
   */
  addFile(name: string, path: string): void {
    if (this.get(name)) throw new ErrnoError(Errno.EEXIST, name);
    if (name.includes(":")) throw new ErrnoError(Errno.EINVAL, name);
    if (!path.startsWith("/")) throw new ErrnoError(Errno.EPERM, `${path} is not absolute`);
    let st: ReturnType<typeof statSync>;
    try {
      st = statSync(path);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new ErrnoError(
        code === "ENOENT" ? Errno.ENOENT : code === "EACCES" ? Errno.EACCES : Errno.EIO,
        path,
      );
    }
    const uid = typeof process.getuid === "function" ? process.getuid() : st.uid;
    if ((st.mode & 0o077) !== 0 || st.uid !== uid) throw new ErrnoError(Errno.EPERM, `${path} permissions`);
    this.#keys.push({ name, path, refs: 0 });
  }

  /** keyring_file_remove_key: ENOKEY when there is no such key. */
  remove(name: string): void {
    const at = this.#keys.findIndex((k) => k.name === name);
    if (at < 0) throw new ErrnoError(Errno.ENOKEY, name);
    this.#keys.splice(at, 1);
  }
}
