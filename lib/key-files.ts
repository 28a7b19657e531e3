// Where DH-HMAC-CHAP secrets live on the storage node for SPDK's file keyring: one 0600 file per
// key name in a directory only the agent and nvmf_tgt can read. A port, so tests can point it at
// a temporary directory.
import { chmod, mkdir, readdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";

export interface KeyFiles {
  /** Writes (or rewrites) the secret under `name`; returns the absolute path for keyring_file_add_key. */
  write(name: string, secret: string): Promise<string>;
  /** Removes the file; absent counts as removed. */
  remove(name: string): Promise<void>;
  list(): Promise<string[]>;
}

export function dirKeyFiles(dir: string): KeyFiles {
  const at = (name: string) => {
    if (!/^[A-Za-z0-9_.-]+$/.test(name)) throw new Error(`invalid key name ${name}`);
    return join(dir, name);
  };
  return {
    async write(name, secret) {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      const path = at(name);
      await writeFile(path, secret, { mode: 0o600 });
      await chmod(path, 0o600);
      return path;
    },
    async remove(name) {
      await rm(at(name), { force: true });
    },
    async list() {
      try {
        return await readdir(dir);
      } catch {
        return [];
      }
    },
  };
}
