// The keyring of one app with its file module: named keys backed by key files that must be
// absolute, private (no group/other bits) and owned by the emulator's user, as SPDK insists. A key
// removed while a host still holds it stays, marked removed, until its last user lets go.
import { readFileSync, statSync } from "node:fs";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** A registered key. `refs` counts users besides the keyring itself (hosts, controllers). */
export interface Key {
  readonly name: string;
  readonly path: string;
  refs: number;
  /** keyring_file_remove_key ran while users still held it. */
  removed?: boolean;
}

/** Runtime key store; a crash empties it. */
export class Keyring {
  readonly #keys: Key[] = [];
  /** Removed keys still referenced (SPDK's removed_keys list), oldest first. */
  readonly #removed: Key[] = [];
  readonly #held = new WeakMap<object, readonly Key[]>();

  /** Keys that can be looked up by name. */
  list(): readonly Key[] {
    return this.#keys;
  }

  /** What keyring_get_keys walks: live keys, then removed keys that still have users. */
  listAll(): readonly Key[] {
    return [...this.#keys, ...this.#removed];
  }

  /** Takes a reference on each of `keys` for `owner` (a host entry), as SPDK's get_key does. */
  hold(owner: object, keys: readonly Key[]): void {
    for (const k of keys) k.refs++;
    this.#held.set(owner, keys);
  }

  /** The keys `owner` holds (empty when none). */
  heldBy(owner: object): readonly Key[] {
    return this.#held.get(owner) ?? [];
  }

  /** Drops `owner`'s references; a removed key goes away with its last user. */
  release(owner: object): void {
    for (const k of this.#held.get(owner) ?? []) {
      if (k.refs > 0) k.refs--;
      if (k.removed && k.refs === 0) this.#removed.splice(this.#removed.indexOf(k), 1);
    }
    this.#held.delete(owner);
  }

  /**
   * The key's contents, read from its file at the time of use as the file module does; ErrnoError
   * with the read's errno when the file is gone or unreadable.
   */
  read(key: Key): string {
    try {
      return readFileSync(key.path, "utf8");
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new ErrnoError(
        code === "ENOENT" ? Errno.ENOENT : code === "EACCES" ? Errno.EACCES : Errno.EIO,
        key.path,
      );
    }
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

  /**
   * keyring_file_remove_key: ENOKEY when there is no such key. A key still held moves to the
   * removed list (no longer found by name, still usable by its holders).
   */
  remove(name: string): void {
    const at = this.#keys.findIndex((k) => k.name === name);
    if (at < 0) throw new ErrnoError(Errno.ENOKEY, name);
    const [key] = this.#keys.splice(at, 1) as [Key];
    if (key.refs > 0) {
      key.removed = true;
      this.#removed.push(key);
    }
  }
}
