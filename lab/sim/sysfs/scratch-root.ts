// Scratch directories for simulated hosts. A sysfs tree is hundreds of tiny files: on tmpfs that
// costs milliseconds, on a disk-backed temp directory it can cost a second, so tmpfs is preferred.
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

const TMPFS = "/dev/shm";

/** A scratch directory and its removal; the caller owns it (remove it in afterAll). */
export interface ScratchRoot {
  readonly path: string;
  remove(): Promise<void>;
}

/** Creates a fresh directory named `<prefix>-XXXXXX` on tmpfs when there is one, else in the OS temp dir. */
export async function scratchRoot(prefix = "distort-sim"): Promise<ScratchRoot> {
  const base = existsSync(TMPFS) ? TMPFS : tmpdir();
  const path = await mkdtemp(join(base, `${prefix}-`));
  return { path, remove: () => rm(path, { recursive: true, force: true }) };
}
